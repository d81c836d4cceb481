#!/usr/bin/env bash
# A real, private Kubernetes API server (etcd + kube-apiserver) on 127.0.0.1 for the demo
# and the tests, built from pinned upstream sources through the Go module proxy.
#
#   k8s.sh ensure                      build missing tools into the cache (locked)
#   k8s.sh can-ensure                  fail at once if tools are missing and Go is not
#   k8s.sh up [DIR] [--workloads]      start etcd + kube-apiserver, wait for /readyz; with
#                                      --workloads also kube-controller-manager,
#                                      kube-scheduler and kwok with one fake Node (pods
#                                      are scheduled, get IPs and run; readiness is not
#                                      kwok's to give)
#   k8s.sh down [DIR]                  stop everything `up` started in DIR
#   k8s.sh env [DIR]                   print `export KUBECONFIG=...` and PATH
#   k8s.sh start COMPONENT [DIR]       (re)start a component (etcd, kube-apiserver,
#                                      kube-controller-manager, kube-scheduler, kwok) with
#                                      its old flags
#   k8s.sh stop COMPONENT [DIR] [SIG]  stop one component (SIG: TERM default, or KILL)
#   k8s.sh sa-kubeconfig NAMESPACE SA OUT [DIR]
#                                      mint a kubeconfig for a ServiceAccount (TokenRequest)
#   k8s.sh netns up NAME SUBNET        test host: netns NAME, veth, SUBNET = a.b.c (a /24)
#   k8s.sh netns down NAME             remove it and every process inside
#   k8s.sh netns gc                    remove netns left behind by dead owners
#   k8s.sh tools-dir                   print the cache's bin directory
#   k8s.sh cert-manager-crds           fetch cert-manager's CRDs at the pinned version (Go
#                                      module proxy, cached) and print their directory
#   k8s.sh gateway-api-crds            the same for Gateway API's standard-channel CRDs
#   k8s.sh gateway-api-experimental-crds   the same for its experimental channel
#   k8s.sh gateway-api-conformance     print the pinned conformance module's directory (its
#                                      base/manifests.yaml is what the suite applies)
#
# Environment: HOLDFAST_TOOLS_DIR (cache root for this pin set), HOLDFAST_K8S_DIR (default
# DIR), HOLDFAST_OWNER_PID (if set, `up` and `netns up` tear down when that process dies),
# HOLDFAST_POD_SUBNET (a.b.c: with --workloads, pods get addresses from a.b.c.0/24).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"

PIN="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_grpcurl-${GRPCURL_VERSION}"
TOOLS_DIR=${HOLDFAST_TOOLS_DIR:-$HOME/.cache/holdfast/tools/$PIN}
BIN=$TOOLS_DIR/bin
DEFAULT_DIR=${HOLDFAST_K8S_DIR:-$REPO/.holdfast/k8s}
READY_TIMEOUT=${HOLDFAST_READY_TIMEOUT:-60}

log() { printf 'k8s.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------------------
# ensure: build etcd, kube-apiserver, kubectl, grpcurl, h2spec, the OpenTelemetry
# Collector, promtool and helm from
# pinned module versions.

have_all_tools() {
  [[ -x $BIN/etcd && -x $BIN/kube-apiserver && -x $BIN/kubectl && -x $BIN/grpcurl ]] &&
    have_stamped h2spec "$H2SPEC_VERSION" && have_stamped promtool "$PROMETHEUS_VERSION" &&
    have_stamped helm "$HELM_VERSION" &&
    have_stamped kube-controller-manager "$KUBERNETES_VERSION" &&
    have_stamped kube-scheduler "$KUBERNETES_VERSION" && have_stamped kwok "$KWOK_VERSION" &&
    have_stamped_file kwok-crds.yaml "$KWOK_VERSION" &&
    have_stamped echo-basic "$GATEWAY_API_VERSION" &&
    have_stamped gateway-conformance "$GATEWAY_API_VERSION" &&
    have_stamped coredns "$COREDNS_VERSION" &&
    have_stamped otelcol "$OTELCOL_VERSION"
}

# Tools outside PIN (a new h2spec, promtool or helm must not rebuild Kubernetes) have their
# version stamped next to the binary: have_stamped NAME VERSION.
have_stamped() {
  [[ -x $BIN/$1 && "$(cat "$BIN/$1.version" 2>/dev/null)" == "$2" ]]
}

# have_stamped_file NAME VERSION: the same for a file that is not a program.
have_stamped_file() {
  [[ -f $BIN/$1 && "$(cat "$BIN/$1.version" 2>/dev/null)" == "$2" ]]
}

# go_install NAME PACKAGE@VERSION: builds one command from the Go module proxy into $BIN
# and stamps its version.
go_install() {
  local name=$1 pkg=$2 work=$TOOLS_DIR/src/$1
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && CGO_ENABLED=0 GOBIN="$work" go install -trimpath -ldflags "-s -w" "$pkg")
  mv "$work/$name" "$BIN/$name"
  printf '%s\n' "${pkg##*@}" >"$BIN/$name.version"
}

build_otelcol() {
  grep -q "go.opentelemetry.io/collector/otelcol $OTELCOL_VERSION" "$HERE/otelcol/go.mod" ||
    die "deploy/local/otelcol/go.mod does not pin the collector at $OTELCOL_VERSION"
  (cd "$HERE/otelcol" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
    -o "$BIN/.otelcol.tmp" .)
  mv "$BIN/.otelcol.tmp" "$BIN/otelcol"
  printf '%s\n' "$OTELCOL_VERSION" >"$BIN/otelcol.version"
}

build_h2spec() {
  grep -q "github.com/summerwind/h2spec $H2SPEC_VERSION" "$HERE/h2spec/go.mod" ||
    die "deploy/local/h2spec/go.mod does not pin h2spec $H2SPEC_VERSION"
  (cd "$HERE/h2spec" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
    -o "$BIN/.h2spec.tmp" github.com/summerwind/h2spec/cmd/h2spec)
  mv "$BIN/.h2spec.tmp" "$BIN/h2spec"
  printf '%s\n' "$H2SPEC_VERSION" >"$BIN/h2spec.version"
}

# The Gateway API conformance suite's test binary (`go test -c` of the suite's package,
# its code unmodified) and echo-basic, from the wrapper module that pins both modules.
build_gateway_api() {
  local mod=$HERE/gateway-api/go.mod m
  for m in sigs.k8s.io/gateway-api sigs.k8s.io/gateway-api/conformance; do
    grep -q "^	$m $GATEWAY_API_VERSION\$" "$mod" ||
      die "deploy/local/gateway-api/go.mod does not pin $m $GATEWAY_API_VERSION"
  done
  (cd "$HERE/gateway-api" &&
    CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$BIN/.echo-basic.tmp" \
      sigs.k8s.io/gateway-api/conformance/echo-basic &&
    CGO_ENABLED=0 go test -c -mod=readonly -trimpath -o "$BIN/.gateway-conformance.tmp" \
      sigs.k8s.io/gateway-api/conformance)
  mv "$BIN/.echo-basic.tmp" "$BIN/echo-basic"
  mv "$BIN/.gateway-conformance.tmp" "$BIN/gateway-conformance"
  printf '%s\n' "$GATEWAY_API_VERSION" | tee "$BIN/echo-basic.version" >"$BIN/gateway-conformance.version"
}

build_etcd() {
  local work=$TOOLS_DIR/src/etcd
  rm -rf "$work" && mkdir -p "$work"
  # etcd's server module has relative replaces, so `go install` refuses it; a wrapper
  # module that requires it (replaces of dependencies are ignored) builds the real server.
  cat >"$work/go.mod" <<EOF
module holdfast.local/tools/etcd

go 1.24
EOF
  cat >"$work/main.go" <<'EOF'
// The etcd server, built through a wrapper module (see deploy/local/k8s.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (cd "$work" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/.etcd.tmp" .)
  mv "$BIN/.etcd.tmp" "$BIN/etcd"
}

# build_kubernetes CMD...: builds commands of k8s.io/kubernetes (cmd/CMD) at
# KUBERNETES_VERSION into $BIN.
build_kubernetes() {
  local work=$TOOLS_DIR/src/kubernetes gomod staging minor ldflags now pkg cmd
  rm -rf "$work" && mkdir -p "$work"
  # k8s.io/kubernetes replaces its staging modules with ./staging paths, so `go install`
  # refuses it. A wrapper module requires it and points each staging module at its
  # published version of the same release (what kubernetes/autoscaler's e2e go.mod does).
  gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION"
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod")
  [[ -n $staging ]] || die "found no staging replaces in $gomod"
  {
    echo "module holdfast.local/tools/kubernetes"
    echo
    sed -n 's/^\(go [0-9.]*\)$/\1/p; s/^\(godebug .*\)$/\1/p' "$gomod"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $KUBERNETES_STAGING_VERSION"; done
    echo ")"
  } >"$work/go.mod"
  minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$now"
  done
  local -a pkgs=()
  for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd@$KUBERNETES_VERSION"); done
  (cd "$work" && go get "${pkgs[@]}")
  for cmd in "$@"; do
    (cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
      -o "$BIN/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$BIN/.$cmd.tmp" "$BIN/$cmd"
    printf '%s\n' "$KUBERNETES_VERSION" >"$BIN/$cmd.version"
  done
}

build_grpcurl() {
  local work=$TOOLS_DIR/src/grpcurl
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && CGO_ENABLED=0 GOBIN="$work" go install -trimpath \
    -ldflags "-s -w -X main.version=$GRPCURL_VERSION" \
    "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION")
  mv "$work/grpcurl" "$BIN/grpcurl"
}

need_go() {
  [[ -x /usr/local/go/bin/go ]] && PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || die "go is not installed; the tools are built from source with it"
}

cmd_ensure() {
  mkdir -p "$BIN"
  have_all_tools && return 0
  need_go
  # Parallel test binaries call ensure at once: one builds, the others wait for it.
  exec 9>"$TOOLS_DIR/.lock"
  flock 9
  local start=$SECONDS
  [[ -x $BIN/etcd ]] || { log "building etcd $ETCD_VERSION"; build_etcd; }
  [[ -x $BIN/grpcurl ]] || { log "building grpcurl $GRPCURL_VERSION"; build_grpcurl; }
  have_stamped h2spec "$H2SPEC_VERSION" || { log "building h2spec $H2SPEC_VERSION"; build_h2spec; }
  have_stamped otelcol "$OTELCOL_VERSION" || { log "building the OpenTelemetry Collector $OTELCOL_VERSION"; build_otelcol; }
  have_stamped promtool "$PROMETHEUS_VERSION" || {
    log "building promtool $PROMETHEUS_VERSION"
    go_install promtool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  }
  have_stamped helm "$HELM_VERSION" || {
    log "building helm $HELM_VERSION"
    go_install helm "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  }
  if [[ ! -x $BIN/kube-apiserver || ! -x $BIN/kubectl ]]; then
    log "building kube-apiserver and kubectl $KUBERNETES_VERSION (first time: many minutes)"
    build_kubernetes kube-apiserver kubectl
  fi
  if ! have_stamped kube-controller-manager "$KUBERNETES_VERSION" ||
    ! have_stamped kube-scheduler "$KUBERNETES_VERSION"; then
    log "building kube-controller-manager and kube-scheduler $KUBERNETES_VERSION"
    build_kubernetes kube-controller-manager kube-scheduler
  fi
  if ! have_stamped echo-basic "$GATEWAY_API_VERSION" ||
    ! have_stamped gateway-conformance "$GATEWAY_API_VERSION"; then
    log "building the Gateway API conformance suite and echo-basic $GATEWAY_API_VERSION"
    build_gateway_api
  fi
  have_stamped_file kwok-crds.yaml "$KWOK_VERSION" || {
    # kwok serves `pods/log` from files that Logs objects name (the pod agent writes them),
    # and `pods/portforward` to the addresses PortForward objects name.
    local kwok_mod
    kwok_mod=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
    {
      cat "$kwok_mod/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml"
      printf -- '---\n'
      cat "$kwok_mod/kustomize/crd/bases/kwok.x-k8s.io_portforwards.yaml"
    } >"$BIN/.kwok-crds.yaml.tmp"
    chmod 0644 "$BIN/.kwok-crds.yaml.tmp"
    mv "$BIN/.kwok-crds.yaml.tmp" "$BIN/kwok-crds.yaml"
    printf '%s\n' "$KWOK_VERSION" >"$BIN/kwok-crds.yaml.version"
  }
  have_stamped kwok "$KWOK_VERSION" || {
    log "building kwok $KWOK_VERSION"
    go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  }
  have_stamped coredns "$COREDNS_VERSION" || {
    log "building coredns $COREDNS_VERSION"
    go_install coredns "github.com/coredns/coredns@$COREDNS_VERSION"
  }
  rm -rf "$TOOLS_DIR/src"
  log "tools ready in $BIN ($((SECONDS - start)) s)"
  flock -u 9
}

# ---------------------------------------------------------------------------------------
# cert-manager-crds: cert-manager's CustomResourceDefinitions at CERT_MANAGER_VERSION, so
# the Certificates and Issuers of deploy/kubernetes/certificates.yaml can be checked by a
# real API server. Release assets (GitHub) are not reachable here; the Go module of the
# same tag is, and its deploy/crds holds the CRDs (plain controller-gen YAML in recent
# releases; older ones, v1.16 for example, wrap the same YAML in a few Helm template lines,
# which are rendered below). For checking manifests, not for installing cert-manager: use
# its release manifests or Helm chart for that.

CERT_MANAGER_MODULE=github.com/cert-manager/cert-manager
CERT_MANAGER_CRDS=$TOOLS_DIR/cert-manager-$CERT_MANAGER_VERSION/crds

# module_dir MODULE@VERSION: downloads a module through the Go module proxy (cached) and
# prints its directory.
module_dir() {
  local json
  json=$(cd "$TOOLS_DIR" && go mod download -json "$1") ||
    die "go mod download $1 failed:" \
      "$(sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json"
}

# crds_workdir DEST: a new directory beside DEST to fill and then move to DEST at once.
crds_workdir() {
  mkdir -p "$(dirname "$1")"
  mktemp -d "$(dirname "$1")/.crds.XXXXXX"
}

# fail WORK MESSAGE...: removes the half-made directory WORK, then dies.
fail() {
  rm -rf "$1"
  shift
  die "$*"
}

fetch_cert_manager_crds() {
  local work mod f crd
  work=$(crds_workdir "$CERT_MANAGER_CRDS")
  mod=$(module_dir "$CERT_MANAGER_MODULE@$CERT_MANAGER_VERSION") || fail "$work" "no module directory"
  [[ -d $mod/deploy/crds ]] || fail "$work" "$CERT_MANAGER_MODULE@$CERT_MANAGER_VERSION has no deploy/crds"
  for f in "$mod"/deploy/crds/*.yaml; do
    grep -q '^kind: CustomResourceDefinition$' "$f" || continue
    # Helm-templated releases: the only template code outside comments is in labels.
    sed -e "s/'{{ template \"cert-manager.name\" . }}'/cert-manager/" \
      -e "s/'{{ .Release.Name }}'/cert-manager/" "$f" >"$work/${f##*/}"
    if grep -v '^[[:space:]]*#' "$work/${f##*/}" | grep '{{' >/dev/null; then
      fail "$work" "${f#"$mod"/} holds Helm template code this script cannot render"
    fi
  done
  for crd in certificates issuers clusterissuers certificaterequests; do
    grep -lq "^  name: $crd\.cert-manager\.io\$" "$work"/*.yaml 2>/dev/null ||
      fail "$work" "no $crd.cert-manager.io CRD in $CERT_MANAGER_MODULE@$CERT_MANAGER_VERSION/deploy/crds"
  done
  publish_crds "$work" "$CERT_MANAGER_CRDS" "cert-manager $CERT_MANAGER_VERSION"
}

# publish_crds WORK DEST WHAT: moves the filled WORK to DEST in one step (atomic: a
# parallel caller that finished first keeps its identical copy).
publish_crds() {
  chmod 0755 "$1"
  mv -T "$1" "$2" 2>/dev/null || rm -rf "$1"
  log "$3 CRDs in $2"
}

# cached_crds DIR FETCH: prints DIR, after running FETCH (which needs Go) if DIR is not
# there yet.
cached_crds() {
  if [[ ! -d $1 ]]; then
    need_go
    "$2"
  fi
  echo "$1"
}

# gateway-api-crds: Gateway API's standard-channel CustomResourceDefinitions at
# GATEWAY_API_VERSION, from the Go module's config/crd/standard (the same YAML as the
# release's standard-install.yaml, without its ValidatingAdmissionPolicy).
# gateway-api-experimental-crds: the experimental channel's, from config/crd/experimental
# (what the features still experimental at that version need, such as HTTPRoute retry).

GATEWAY_API_CRDS=$TOOLS_DIR/gateway-api-$GATEWAY_API_VERSION/crds
GATEWAY_API_EXPERIMENTAL_CRDS=$TOOLS_DIR/gateway-api-$GATEWAY_API_VERSION/crds-experimental

# fetch_channel_crds CHANNEL DEST
fetch_channel_crds() {
  local channel=$1 dest=$2 work mod f crd
  work=$(crds_workdir "$dest")
  mod=$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION") || fail "$work" "no module directory"
  for f in "$mod"/config/crd/"$channel"/*.yaml; do
    grep -q '^kind: CustomResourceDefinition$' "$f" && cp "$f" "$work/"
  done
  for crd in gatewayclasses gateways httproutes grpcroutes tlsroutes referencegrants; do
    [[ -f $work/gateway.networking.k8s.io_$crd.yaml ]] ||
      fail "$work" "no $crd CRD in sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION/config/crd/$channel"
  done
  chmod 0644 "$work"/*.yaml
  publish_crds "$work" "$dest" "Gateway API $GATEWAY_API_VERSION $channel"
}

fetch_gateway_api_crds() {
  fetch_channel_crds standard "$GATEWAY_API_CRDS"
}

fetch_gateway_api_experimental_crds() {
  fetch_channel_crds experimental "$GATEWAY_API_EXPERIMENTAL_CRDS"
}

# ---------------------------------------------------------------------------------------
# up / down / start / stop

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

write_certs() {
  local dir=$1 pki=$1/pki
  [[ -f $pki/admin.crt ]] && return 0
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
      -subj "/CN=holdfast-local-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    # O=system:masters: the admin identity bypasses RBAC, like kubeadm's admin.conf.
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr \
      -subj "/O=system:masters/CN=holdfast-admin" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >admin.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile admin.ext -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext
  )
}

write_args() {
  local dir=$1 etcd_port peer_port api_port
  etcd_port=$(free_port)
  peer_port=$(free_port)
  api_port=$(free_port)
  rm -rf "$dir/etcd-data"
  mkdir -p "$dir/etcd-data"
  # One argument per line, so `start` (and the Rust test helpers) can restart a component
  # with exactly the flags it had.
  cat >"$dir/etcd.args" <<EOF
$BIN/etcd
--name=holdfast-local
--data-dir=$dir/etcd-data
--listen-client-urls=http://127.0.0.1:$etcd_port
--advertise-client-urls=http://127.0.0.1:$etcd_port
--listen-peer-urls=http://127.0.0.1:$peer_port
--initial-advertise-peer-urls=http://127.0.0.1:$peer_port
--initial-cluster=holdfast-local=http://127.0.0.1:$peer_port
--unsafe-no-fsync=true
--log-level=warn
EOF
  cat >"$dir/kube-apiserver.args" <<EOF
$BIN/kube-apiserver
--etcd-servers=http://127.0.0.1:$etcd_port
--bind-address=127.0.0.1
--advertise-address=127.0.0.1
--secure-port=$api_port
--tls-cert-file=$dir/pki/apiserver.crt
--tls-private-key-file=$dir/pki/apiserver.key
--client-ca-file=$dir/pki/ca.crt
--authorization-mode=RBAC
--service-cluster-ip-range=10.96.0.0/16
--service-account-issuer=https://kubernetes.default.svc.cluster.local
--service-account-key-file=$dir/pki/sa.pub
--service-account-signing-key-file=$dir/pki/sa.key
--api-audiences=https://kubernetes.default.svc.cluster.local
--enable-priority-and-fairness=false
--profiling=false
--v=0
EOF
  echo "$etcd_port" >"$dir/etcd.port"
  echo "$api_port" >"$dir/kube-apiserver.port"
}

write_kubeconfig() {
  local dir=$1 port
  port=$(cat "$dir/kube-apiserver.port")
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: holdfast-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $dir/pki/ca.crt
users:
- name: holdfast-admin
  user:
    client-certificate: $dir/pki/admin.crt
    client-key: $dir/pki/admin.key
contexts:
- name: holdfast-local
  context:
    cluster: holdfast-local
    user: holdfast-admin
current-context: holdfast-local
EOF
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

cmd_start() {
  local component=$1 dir=$2
  case $component in
    etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kwok) ;;
    *) die "unknown component $component" ;;
  esac
  [[ -f $dir/$component.args ]] || die "$dir has no $component.args; run 'up' first"
  pid_alive "$dir/$component.pid" && die "$component is already running"
  local -a argv
  mapfile -t argv <"$dir/$component.args"
  # setsid: a Ctrl-C meant for the caller's terminal must not reach the server directly;
  # `down` (or the owner watchdog) stops it.
  setsid "${argv[@]}" >>"$dir/$component.log" 2>&1 </dev/null &
  echo $! >"$dir/$component.pid"
}

cmd_stop() {
  local component=$1 dir=$2 sig=${3:-TERM} pid i
  [[ -f $dir/$component.pid ]] || return 0
  pid=$(cat "$dir/$component.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -s "$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -s KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    fi
  fi
  rm -f "$dir/$component.pid"
}

wait_ready() {
  local dir=$1 deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    pid_alive "$dir/kube-apiserver.pid" || {
      tail -n 20 "$dir/kube-apiserver.log" >&2
      return 1
    }
    if [[ $("$BIN/kubectl" --kubeconfig "$dir/kubeconfig" get --raw /readyz 2>/dev/null) == ok ]]; then
      return 0
    fi
    sleep 0.2
  done
  log "kube-apiserver not ready after ${READY_TIMEOUT}s; last log lines:"
  tail -n 20 "$dir/kube-apiserver.log" >&2
  return 1
}

start_watchdog() {
  local dir=$1 owner=$2
  # Tears the cluster down when the owner (a test binary, the demo) dies, even by SIGKILL.
  # shellcheck disable=SC2016 # $1 and $2 are the inner shell's arguments
  setsid bash -c '
    while kill -0 "$1" 2>/dev/null && [[ -f "$2/etcd.args" ]]; do sleep 1; done
    [[ -f "$2/etcd.args" ]] && exec "$3" down "$2"
  ' watchdog "$owner" "$dir" "$HERE/k8s.sh" >/dev/null 2>&1 </dev/null &
  echo $! >"$dir/watchdog.pid"
}

cmd_up() {
  local dir=$1 workloads=${2:-} attempt
  cmd_ensure
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if pid_alive "$dir/kube-apiserver.pid" || pid_alive "$dir/etcd.pid"; then
    die "a cluster is already running in $dir; run 'down $dir' first"
  fi
  write_certs "$dir"
  # Ports are picked free and then bound by another process: retry if one was taken.
  for attempt in 1 2 3; do
    write_args "$dir"
    write_kubeconfig "$dir"
    : >"$dir/etcd.log"
    : >"$dir/kube-apiserver.log"
    cmd_start etcd "$dir"
    cmd_start kube-apiserver "$dir"
    if wait_ready "$dir"; then
      [[ -n ${HOLDFAST_OWNER_PID:-} ]] && start_watchdog "$dir" "$HOLDFAST_OWNER_PID"
      if [[ $workloads == --workloads ]]; then
        write_workload_args "$dir"
        cmd_workloads "$dir"
      fi
      echo "kubeconfig: $dir/kubeconfig"
      echo "etcd: pid $(cat "$dir/etcd.pid") port $(cat "$dir/etcd.port")"
      echo "kube-apiserver: pid $(cat "$dir/kube-apiserver.pid") port $(cat "$dir/kube-apiserver.port")"
      return 0
    fi
    log "attempt $attempt failed; retrying with new ports"
    cmd_stop kube-apiserver "$dir" KILL
    cmd_stop etcd "$dir" KILL
  done
  die "kube-apiserver did not become ready (logs in $dir)"
}

# The workloads' components: the controllers and the scheduler a Deployment needs, and
# kwok for the nodes and the pod lifecycle. All talk to kube-apiserver as the admin.
WORKLOADS=(kube-controller-manager kube-scheduler kwok)
# Pod IPs kwok hands out (the pod agent gives each pod a network namespace with its IP):
# HOLDFAST_POD_SUBNET=a.b.c makes them a.b.c.0/24 (the tests lease one per cluster, so
# that clusters side by side never route the same addresses; the agent's bridge to the
# host takes a.b.c.254), else 10.244.0.0/16.
POD_CIDR=10.244.0.0/16
pod_cidr_from_env() {
  if [[ -n ${HOLDFAST_POD_SUBNET:-} ]]; then
    [[ $HOLDFAST_POD_SUBNET =~ ^10\.[0-9]+\.[0-9]+$ ]] ||
      die "HOLDFAST_POD_SUBNET must be 10.X.Y (a /24 in 10.0.0.0/8)"
    POD_CIDR=$HOLDFAST_POD_SUBNET.0/24
  fi
}
# The one fake Node.
NODE_NAME=kwok-node-0

write_workload_args() {
  local dir=$1 kwok_port
  pod_cidr_from_env
  kwok_port=$(free_port)
  # Flags both take: the admin kubeconfig, no serving port, no leader election.
  local common
  common=$(printf '%s\n' "--kubeconfig=$dir/kubeconfig" \
    "--authentication-kubeconfig=$dir/kubeconfig" "--authorization-kubeconfig=$dir/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false --profiling=false --v=0)
  cat >"$dir/kube-controller-manager.args" <<EOF
$BIN/kube-controller-manager
$common
--controllers=deployment-controller,replicaset-controller,endpointslice-controller,endpointslice-mirroring-controller,serviceaccount-controller,serviceaccount-token-controller,garbage-collector-controller,namespace-controller
--service-account-private-key-file=$dir/pki/sa.key
--root-ca-file=$dir/pki/ca.crt
--use-service-account-credentials=false
--concurrent-deployment-syncs=2
--concurrent-replicaset-syncs=2
EOF
  cat >"$dir/kube-scheduler.args" <<EOF
$BIN/kube-scheduler
$common
EOF
  cat >"$dir/kwok.args" <<EOF
$BIN/kwok
--kubeconfig=$dir/kubeconfig
--config=$HERE/kwok/stages.yaml
--manage-all-nodes=false
--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake
--cidr=$POD_CIDR
--node-ip=127.0.0.1
--node-name=$NODE_NAME
--node-port=$kwok_port
--server-address=127.0.0.1:$kwok_port
--enable-crds=Logs,PortForward
EOF
}

# workloads DIR: starts the workloads' components against the cluster in DIR and waits
# until the fake Node is Ready (kwok runs) and the default ServiceAccount exists (the
# controllers run).
cmd_workloads() {
  local dir=$1 c deadline
  pod_cidr_from_env
  # kwok's Logs and PortForward kinds, which kwok watches for the files it serves through
  # pods/log and the addresses it forwards pods/portforward to.
  "$BIN/kubectl" --kubeconfig "$dir/kubeconfig" apply --server-side \
    -f "$BIN/kwok-crds.yaml" >/dev/null
  "$BIN/kubectl" --kubeconfig "$dir/kubeconfig" wait --for=condition=Established \
    --timeout="${READY_TIMEOUT}s" crd/logs.kwok.x-k8s.io crd/portforwards.kwok.x-k8s.io >/dev/null
  for c in "${WORKLOADS[@]}"; do
    : >"$dir/$c.log"
    cmd_start "$c" "$dir"
  done
  "$BIN/kubectl" --kubeconfig "$dir/kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $NODE_NAME
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: $NODE_NAME
    type: kwok
spec:
  podCIDR: $POD_CIDR
EOF
  deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    for c in "${WORKLOADS[@]}"; do
      pid_alive "$dir/$c.pid" || {
        tail -n 20 "$dir/$c.log" >&2
        die "$c exited (log: $dir/$c.log)"
      }
    done
    if [[ $("$BIN/kubectl" --kubeconfig "$dir/kubeconfig" get node "$NODE_NAME" \
      -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]] &&
      "$BIN/kubectl" --kubeconfig "$dir/kubeconfig" -n default get serviceaccount default \
        >/dev/null 2>&1; then
      # kube-apiserver taints a new Node not-ready; the node lifecycle controller would
      # lift it, but it also evicts pods from nodes without kubelet heartbeats, so it
      # is not run: the taint is lifted here, once kwok has made the Node Ready.
      "$BIN/kubectl" --kubeconfig "$dir/kubeconfig" taint node "$NODE_NAME" \
        node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
      if [[ -z $("$BIN/kubectl" --kubeconfig "$dir/kubeconfig" get node "$NODE_NAME" \
        -o 'jsonpath={.spec.taints}' 2>/dev/null) ]]; then
        echo "workloads: node $NODE_NAME Ready, controllers and scheduler running"
        return 0
      fi
    fi
    sleep 0.2
  done
  die "the workloads did not come up within ${READY_TIMEOUT}s (logs in $dir)"
}

cmd_down() {
  local dir=$1 c
  [[ -d $dir ]] || return 0
  for c in "${WORKLOADS[@]}"; do cmd_stop "$c" "$dir"; done
  rm -f "$dir/kube-controller-manager.args" "$dir/kube-scheduler.args" "$dir/kwok.args"
  cmd_stop kube-apiserver "$dir"
  cmd_stop etcd "$dir"
  rm -f "$dir/etcd.args" "$dir/kube-apiserver.args"
  if [[ -f $dir/watchdog.pid ]]; then
    local w
    w=$(cat "$dir/watchdog.pid")
    if [[ $w != "$$" ]]; then kill "$w" 2>/dev/null || true; fi
    rm -f "$dir/watchdog.pid"
  fi
  rm -rf "$dir/etcd-data"
}

cmd_env() {
  local dir=$1
  dir=$(cd "$dir" 2>/dev/null && pwd) || die "no cluster directory $1"
  echo "export KUBECONFIG=$dir/kubeconfig"
  echo "export PATH=$BIN:\$PATH"
}

cmd_sa_kubeconfig() {
  local ns=$1 sa=$2 out=$3 dir=$4 token port
  port=$(cat "$dir/kube-apiserver.port")
  token=$("$BIN/kubectl" --kubeconfig "$dir/kubeconfig" -n "$ns" create token "$sa" --duration=24h)
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: holdfast-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $dir/pki/ca.crt
users:
- name: $ns-$sa
  user:
    token: $token
contexts:
- name: $ns-$sa
  context:
    cluster: holdfast-local
    user: $ns-$sa
    namespace: $ns
current-context: $ns-$sa
EOF
  echo "$out"
}

# ---------------------------------------------------------------------------------------
# netns: test hosts with real (non-loopback) addresses, because the API server rejects
# loopback addresses in EndpointSlices. NAME is hf-<owner pid>-<suffix>; the host side of
# the veth gets SUBNET.1/24 and the namespace side SUBNET.2/24 (add more addresses inside
# with `ip netns exec NAME ip addr add`).

netns_links() {
  # Interface names are at most 15 bytes: derive short ones from a hash of NAME.
  local h
  h=$(printf '%s' "$1" | sha1sum | cut -c1-8)
  echo "hf${h}h hf${h}n"
}

cmd_netns_up() {
  local name=$1 subnet=$2 host_if ns_if
  [[ $name =~ ^hf-[0-9]+-[A-Za-z0-9-]+$ ]] || die "netns name must be hf-<owner pid>-<suffix>"
  [[ $subnet =~ ^10\.[0-9]+\.[0-9]+$ ]] || die "subnet must be 10.X.Y (a /24 in 10.0.0.0/8)"
  cmd_netns_gc
  read -r host_if ns_if < <(netns_links "$name")
  ip netns add "$name"
  ip link add "$host_if" type veth peer name "$ns_if"
  ip link set "$ns_if" netns "$name"
  ip addr add "$subnet.1/24" dev "$host_if"
  ip link set "$host_if" up
  ip netns exec "$name" ip addr add "$subnet.2/24" dev "$ns_if"
  ip netns exec "$name" ip link set "$ns_if" up
  ip netns exec "$name" ip link set lo up
  ip netns exec "$name" ip route add default via "$subnet.1"
  echo "$name host=$subnet.1 ns=$subnet.2"
}

cmd_netns_down() {
  local name=$1 host_if ns_if pids
  read -r host_if ns_if < <(netns_links "$name")
  if ip netns list | grep -w "^$name" >/dev/null; then
    pids=$(ip netns pids "$name" 2>/dev/null || true)
    # shellcheck disable=SC2086 # one pid per word
    if [[ -n $pids ]]; then kill -9 $pids 2>/dev/null || true; fi
    ip netns del "$name" 2>/dev/null || true
  fi
  ip link del "$host_if" 2>/dev/null || true
}

cmd_netns_gc() {
  local name owner bridge
  # The pod agent's bridges (hfb<agent pid>) of agents that are gone.
  for bridge in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' |
    grep -E '^hfb[0-9]+$' || true); do
    kill -0 "${bridge#hfb}" 2>/dev/null || ip link del "$bridge" 2>/dev/null || true
  done
  for name in $(ip netns list | awk '{print $1}' | grep -E '^hf-[0-9]+-' || true); do
    owner=$(echo "$name" | cut -d- -f2)
    kill -0 "$owner" 2>/dev/null || cmd_netns_down "$name"
  done
}

# ---------------------------------------------------------------------------------------

main() {
  local cmd=${1:-}
  shift || true
  case $cmd in
  ensure) cmd_ensure ;;
  can-ensure) have_all_tools || need_go ;;
  tools-dir) echo "$BIN" ;;
  cert-manager-crds) cached_crds "$CERT_MANAGER_CRDS" fetch_cert_manager_crds ;;
  gateway-api-crds) cached_crds "$GATEWAY_API_CRDS" fetch_gateway_api_crds ;;
  gateway-api-experimental-crds)
    cached_crds "$GATEWAY_API_EXPERIMENTAL_CRDS" fetch_gateway_api_experimental_crds
    ;;
  gateway-api-conformance)
    need_go
    module_dir "sigs.k8s.io/gateway-api/conformance@$GATEWAY_API_VERSION"
    ;;
  up)
    local dir=$DEFAULT_DIR workloads="" arg
    for arg in "$@"; do
      case $arg in
        --workloads) workloads=--workloads ;;
        -*) die "unknown option for up: $arg" ;;
        *) dir=$arg ;;
      esac
    done
    cmd_up "$dir" "$workloads"
    ;;
  down) cmd_down "${1:-$DEFAULT_DIR}" ;;
  env) cmd_env "${1:-$DEFAULT_DIR}" ;;
  start) cmd_start "${1:?component}" "${2:-$DEFAULT_DIR}"; wait_ready_if_api "${1}" "${2:-$DEFAULT_DIR}" ;;
  stop) cmd_stop "${1:?component}" "${2:-$DEFAULT_DIR}" "${3:-TERM}" ;;
  sa-kubeconfig) cmd_sa_kubeconfig "${1:?namespace}" "${2:?serviceaccount}" "${3:?output path}" "${4:-$DEFAULT_DIR}" ;;
  netns)
    case ${1:-} in
    up) cmd_netns_up "${2:?name}" "${3:?subnet}" ;;
    down) cmd_netns_down "${2:?name}" ;;
    gc) cmd_netns_gc ;;
    *) die "usage: k8s.sh netns up NAME SUBNET | down NAME | gc" ;;
    esac
    ;;
  *)
    sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    [[ -z $cmd ]] && exit 2
    die "unknown command '$cmd'"
    ;;
  esac
}

wait_ready_if_api() {
  # Starting kube-apiserver waits for /readyz; starting etcd returns at once.
  [[ $1 == kube-apiserver ]] && wait_ready "$2"
  return 0
}

main "$@"
