#!/usr/bin/env bash
# The holdfast demo: builds the binaries, starts a real local kube-apiserver and etcd, the
# control plane, two proxies and two echo backends (in a network namespace: Kubernetes
# rejects loopback endpoint addresses), applies deploy/examples/, prints ready-to-paste
# curl and grpcurl commands, and stays in the foreground. Ctrl-C (or SIGTERM) cleans
# everything up. A component that exits (kill the control plane: the proxies keep serving)
# is reported with its log, and `kill -USR1 <demo pid>` (printed) starts it again; logs
# are kept when anything exited abnormally.
# The planes talk mutual TLS and secure.demo.test is served over HTTPS, all with
# certificates from a throwaway local CA (holdfast-dev-certs, rcgen).
# Needs root (network namespace). HOLDFAST_DEMO_SKIP_BUILD=1 skips `cargo build`.
set -euo pipefail
for d in "$HOME/.cargo/bin" /usr/local/go/bin; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && PATH=$PATH:$d
done
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
K8S=$REPO/deploy/local/k8s.sh
SUBNET=10.199.0
NETNS="hf-$$-demo"
DIR=$(mktemp -d /tmp/holdfast-demo.XXXXXX)
pids=()
# Component name -> its pid (the ones the demo can start again).
declare -A pid_of=()
# Set when something exited that the demo did not stop: the logs are kept.
keep_logs=false

cleanup() { # the exit status (0 when stopped by a signal)
  local status=$1
  trap - EXIT INT TERM USR1
  echo
  echo "holdfast demo: cleaning up"
  for p in "${pids[@]}" "${pid_of[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}" "${pid_of[@]}"; do wait "$p" 2>/dev/null || true; done
  bash "$K8S" netns down "$NETNS" >/dev/null 2>&1 || true
  bash "$K8S" down "$DIR/k8s" >/dev/null 2>&1 || true
  if $keep_logs || ((status != 0)); then
    # Keep every log, the API server's and etcd's too; drop their data, keys and state.
    for f in "$DIR"/k8s/*; do [[ $f == *.log ]] || rm -rf "$f"; done
    rm -rf "$DIR/pki" "$DIR"/proxy-*/
    echo "holdfast demo: stopped; logs kept in $DIR (rm -r $DIR when done)"
  else
    rm -rf "$DIR"
    echo "holdfast demo: stopped"
  fi
}
trap 'cleanup 0; exit 0' INT TERM
trap 'cleanup $?' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
until_ok() { # description, command...; 60 s deadline
  local what=$1 deadline=$((SECONDS + 60)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "holdfast demo: timed out waiting for $what" >&2; exit 1; }
    sleep 0.2
  done
}

if [[ ${HOLDFAST_DEMO_SKIP_BUILD:-0} != 1 ]]; then
  echo "holdfast demo: building (cargo build --workspace --bins)"
  (cd "$REPO" && cargo build --workspace --bins --quiet)
fi
# Where cargo put the binaries ($CARGO_TARGET_DIR when set).
BIN=$(bash "$REPO/deploy/local/target-dir.sh")/debug
TOOLS=$(bash "$K8S" tools-dir)
bash "$K8S" ensure

echo "holdfast demo: starting kube-apiserver and etcd"
HOLDFAST_OWNER_PID=$$ bash "$K8S" up "$DIR/k8s" >"$DIR/k8s-up.log"
export KUBECONFIG=$DIR/k8s/kubeconfig
KUBECTL="$TOOLS/kubectl"

echo "holdfast demo: starting echo backends in network namespace $NETNS ($SUBNET.0/24)"
HOLDFAST_OWNER_PID=$$ bash "$K8S" netns up "$NETNS" "$SUBNET" >/dev/null
for host in 3 4; do ip -n "$NETNS" addr add "$SUBNET.$host/32" dev lo; done
start_echo-a() { ip netns exec "$NETNS" "$BIN/holdfast-echo" --listen "$SUBNET.3:8080" --name echo-a >>"$DIR/echo-a.log" 2>&1 & pid_of[echo-a]=$!; }
start_echo-b() { ip netns exec "$NETNS" "$BIN/holdfast-echo" --listen "$SUBNET.4:8080" --name echo-b >>"$DIR/echo-b.log" 2>&1 & pid_of[echo-b]=$!; }
start_echo-a
start_echo-b

PKI=$DIR/pki
OPERATOR=$("$BIN/holdfast-dev-certs" --out "$PKI" --proxy proxy-1 --proxy proxy-2 --host secure.demo.test)

{
  "$KUBECTL" apply -f "$REPO/deploy/kubernetes/ingressclass.yaml" -f "$REPO/deploy/examples/demo.yaml"
  "$KUBECTL" -n demo create secret tls site-tls --cert "$PKI/site.crt" --key "$PKI/site.key"
  # Gateway API: the standard channel CRDs, then the demo's Gateway and HTTPRoute.
  "$KUBECTL" apply --server-side -f "$(bash "$K8S" gateway-api-crds)"
  "$KUBECTL" wait --for=condition=Established --timeout=60s crd/gateways.gateway.networking.k8s.io \
    crd/httproutes.gateway.networking.k8s.io crd/gatewayclasses.gateway.networking.k8s.io
  "$KUBECTL" apply -f "$REPO/deploy/examples/gateway.yaml"
} >"$DIR/apply.log"

CP=$(free_port); CPA=$(free_port)
start_control-plane() {
  RUST_LOG=${RUST_LOG:-info} "$BIN/holdfast-control-plane" --grpc-listen "127.0.0.1:$CP" --admin-listen "127.0.0.1:$CPA" \
    --ingress-class holdfast --publish-address 127.0.0.1 --lease-namespace default \
    --gateway-address-pool 127.10.0.0/24 \
    --tls-cert "$PKI/control-plane.crt" --tls-key "$PKI/control-plane.key" --client-ca "$PKI/ca.crt" \
    --admin-identities "$OPERATOR" --proxy-identities 'proxy-*' \
    >>"$DIR/control-plane.log" 2>&1 &
  pid_of[control-plane]=$!
}
P=(); S=(); A=(); D=()
for i in 1 2; do P+=("$(free_port)"); S+=("$(free_port)"); A+=("$(free_port)"); D+=("$(free_port)"); done
start_proxy() { # 1 or 2
  local i=$1 j=$(($1 - 1))
  # --verbose-errors is for development: error pages then say which backend failed and why.
  RUST_LOG=${RUST_LOG:-info} "$BIN/holdfast-proxy" --listen "127.0.0.1:${P[$j]}" --listen-tls "127.0.0.1:${S[$j]}" \
    --admin-listen "127.0.0.1:${A[$j]}" --debug-listen "127.0.0.1:${D[$j]}" --verbose-errors \
    --control-plane "https://127.0.0.1:$CP" --state-dir "$DIR/proxy-$i" --node-id "proxy-$i" \
    --tls-cert "$PKI/proxy-$i.crt" --tls-key "$PKI/proxy-$i.key" --control-plane-ca "$PKI/ca.crt" \
    >>"$DIR/proxy-$i.log" 2>&1 &
  pid_of[proxy-$i]=$!
}
start_proxy-1() { start_proxy 1; }
start_proxy-2() { start_proxy 2; }
start_control-plane
start_proxy-1
start_proxy-2
for i in 0 1; do
  until_ok "proxy-$((i + 1))" curl -sf -H 'Host: web.demo.test' "http://127.0.0.1:${P[$i]}/"
  until_ok "proxy-$((i + 1)) over HTTPS" curl -sf --cacert "$PKI/ca.crt" \
    --resolve "secure.demo.test:${S[$i]}:127.0.0.1" "https://secure.demo.test:${S[$i]}/"
done
# The Gateway's address, from its status; one proxy serves it (two proxies on one host
# cannot both bind it; in a cluster each has its own).
gateway_address() { "$KUBECTL" -n demo get gateway demo -o jsonpath='{.status.addresses[0].value}'; }
has_gateway_address() { [[ -n $(gateway_address) ]]; }
until_ok "the Gateway's address" has_gateway_address
GW=$(gateway_address)
until_ok "the Gateway" curl -sf -H 'Host: gateway.demo.test' "http://$GW:8080/"
GRPCURL="grpcurl -cacert $PKI/ca.crt -cert $PKI/operator.crt -key $PKI/operator.key"

cat <<TXT

holdfast demo ready. Logs: $DIR/*.log. Paste these into another shell (as root):

  $ export PATH=$TOOLS:\$PATH KUBECONFIG=$KUBECONFIG
  $ curl -s -H 'Host: web.demo.test' http://127.0.0.1:${P[0]}/
  $ curl -s -H 'Host: web.demo.test' http://127.0.0.1:${P[1]}/
  $ curl -s -H 'Host: api.demo.test' http://127.0.0.1:${P[0]}/v1/users
  $ curl -s -H 'Host: api.demo.test' http://127.0.0.1:${P[1]}/healthz
  $ curl -s -i -H 'Host: shop.demo.test' http://127.0.0.1:${P[0]}/
  $ curl -s --cacert $PKI/ca.crt --resolve secure.demo.test:${S[0]}:127.0.0.1 https://secure.demo.test:${S[0]}/
  $ curl -s -i -H 'Host: secure.demo.test' http://127.0.0.1:${P[0]}/
  $ curl -s 'http://127.0.0.1:${D[0]}/debug/explain?host=api.demo.test&path=/v1/users'
  $ curl -s -H 'Host: gateway.demo.test' http://$GW:8080/
  $ curl -s -H 'Host: gateway.demo.test' -H 'x-canary: yes' http://$GW:8080/canary
  $ kubectl -n demo get gateway demo
  $ $GRPCURL 127.0.0.1:$CP list
  $ $GRPCURL 127.0.0.1:$CP holdfast.v1.Admin/GetSnapshot
  $ $GRPCURL 127.0.0.1:$CP holdfast.v1.Admin/ListProxies
  $ $GRPCURL 127.0.0.1:$CP holdfast.v1.Admin/GetStatus
  $ kubectl get ingress -A

The gRPC port speaks mutual TLS: grpcurl presents the operator's certificate (identity
$OPERATOR, the only one in --admin-identities). A proxy's certificate, or none, is refused.

Try: kubectl -n demo delete ingress shop (the route goes), or kill the control plane
(the proxies keep serving; the demo keeps running). To start again whatever has exited:

  $ kill -USR1 $$

Ctrl-C stops everything.
TXT
echo "pids: ${pid_of[echo-a]} ${pid_of[echo-b]} ${pid_of[control-plane]} ${pid_of[proxy-1]} ${pid_of[proxy-2]} $(cat "$DIR/k8s/etcd.pid") $(cat "$DIR/k8s/kube-apiserver.pid")"

# Stay in the foreground until Ctrl-C or SIGTERM. A component that exits is reported and
# left down (the point of the demo is that the rest keeps working) until SIGUSR1.
restart=false
trap 'restart=true' USR1
order=(echo-a echo-b control-plane proxy-1 proxy-2)
while :; do
  sleep 1 &
  pids+=($!)
  wait "$!" 2>/dev/null || true
  pids=()
  for name in "${order[@]}"; do
    p=${pid_of[$name]}
    [[ $p == - ]] && continue
    kill -0 "$p" 2>/dev/null && continue
    status=0
    wait "$p" 2>/dev/null || status=$?
    pid_of[$name]=-
    keep_logs=true
    echo "holdfast demo: $name exited (status $status); its log: $DIR/$name.log. The rest keeps running; to start it again: kill -USR1 $$" >&2
  done
  if $restart; then
    restart=false
    started=0
    for name in "${order[@]}"; do
      [[ ${pid_of[$name]} == - ]] || continue
      "start_$name"
      started=$((started + 1))
      echo "holdfast demo: started $name again (pid ${pid_of[$name]})" >&2
    done
    # A component still shutting down is not down yet: say so rather than nothing.
    ((started)) || echo "holdfast demo: nothing has exited; nothing to start (send USR1 again once it has)" >&2
  fi
done
