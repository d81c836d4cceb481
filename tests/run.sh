#!/usr/bin/env bash
# The test command: installs what the suite needs, builds the pinned Kubernetes tools if
# they are not cached yet, checks formatting and lints, and runs every test against the
# real kube-apiserver and etcd. Needs root (network namespaces for test hosts).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Toolchains where this machine kind installs them, in case PATH lacks them.
for d in "$HOME/.cargo/bin" /usr/local/go/bin; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && PATH=$PATH:$d
done
export PATH

# Time per phase, printed at the end (also when a phase fails).
phases=() phase_name="install packages" phase_start=$SECONDS
phase() {
  phases+=("$(printf '%-34s %5d s' "$phase_name" $((SECONDS - phase_start)))")
  phase_name=$1 phase_start=$SECONDS
}
summary() {
  local rc=$?
  phase end
  echo "tests/run.sh: time per phase (exit status $rc)" >&2
  printf '  %s\n' "${phases[@]}" "$(printf '%-34s %5d s' total "$SECONDS")" >&2
  [[ -z ${tools_pid:-} ]] || stop_tools
}
trap summary EXIT

# Debian packages the suite and deploy/local/k8s.sh use; installed only when missing.
missing=()
for pair in curl:curl openssl:openssl ip:iproute2 jq:jq flock:util-linux setsid:util-linux \
  python3:python3 sha1sum:coreutils prlimit:util-linux mount:mount make:make cc:gcc \
  shellcheck:shellcheck; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  echo "tests/run.sh: installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# A full run writes about 10 GB (target/, test clusters); say so before a linker dies of ENOSPC.
avail_gib=$(($(df -Pk . | awk 'NR == 2 { print $4 }') / 1024 / 1024))
if ((avail_gib < 15)); then
  echo "tests/run.sh: warning: only ${avail_gib} GiB free on $(pwd); a full run needs about 15 GiB" >&2
fi

phase "cargo-deny"
# The pinned Go tools (k8s.sh ensure: etcd, kube-apiserver, kubectl, grpcurl, h2spec,
# promtool, helm) build in the background while cargo-deny, clippy and the build run: on a
# brand-new machine they take about 12 minutes, much of it fetching modules, and no step
# before `cargo test` needs them. Own session, so that an early exit stops the whole build.
# Without Go (and tools to build) that fails at once, not after the build.
deploy/local/k8s.sh can-ensure
tools_log=$(mktemp)
setsid --wait deploy/local/k8s.sh ensure >"$tools_log" 2>&1 &
tools_pid=$!
stop_tools() { kill -- -"$tools_pid" 2>/dev/null || true; rm -f "$tools_log"; }

# cargo-deny (pinned) from crates.io into ~/.cargo/bin: a few minutes the first time.
CARGO_DENY_VERSION=0.18.9
if [[ $(cargo deny --version 2>/dev/null) != "cargo-deny $CARGO_DENY_VERSION" ]]; then
  echo "tests/run.sh: cargo install cargo-deny $CARGO_DENY_VERSION" >&2
  cargo install --locked --quiet cargo-deny --version "$CARGO_DENY_VERSION"
fi
# Licenses, banned crates and sources (deny.toml); advisories need GitHub, not reachable.
cargo deny --log-level error check --hide-inclusion-graph licenses bans sources

phase "fmt, clippy, build"
# Every shell script git tracks (sourced files followed from each script's directory), with
# Debian's shellcheck.
mapfile -t scripts < <(git ls-files -- '*.sh' .ci/run)
shellcheck -x --source-path=SCRIPTDIR "${scripts[@]}"
cargo fmt --all -- --check
cargo fmt --manifest-path data-plane/fuzz/afl/Cargo.toml -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --bins --locked
phase "wait for Kubernetes and Go tools"
tools_rc=0
wait "$tools_pid" || tools_rc=$?
cat "$tools_log" >&2
rm -f "$tools_log"
tools_pid=
if ((tools_rc != 0)); then
  echo "tests/run.sh: deploy/local/k8s.sh ensure failed (exit status $tools_rc)" >&2
  exit 1
fi
phase "cargo test"
# --all-targets also runs each criterion benchmark once (test mode), so the harness cannot rot.
cargo test --workspace --all-targets --locked "$@"
phase "data-plane tests on the hyper engine"
# The end-to-end tests that serve HTTP through the proxy again with hyper serving HTTP/1.1
# (--h1-engine=hyper, kept for one release), so both engines pass them: the data plane,
# HTTPS, h2spec, the Gateway API tests and filters, and the conformance suite. The admin
# test checks which engine the proxy reports serving.
HOLDFAST_H1_ENGINE=hyper cargo test -p holdfast-tests --test e2e --locked -- \
  access_log:: traces::a_sampled proxy_fed_by_test:: proxy_on_cluster:: https_fed_by_test:: https_on_cluster:: h2spec:: gateway_api:: gateway_filters:: ingress_nginx:: \
  conformance::
phase "AFL++ fuzzing"
# Coverage-guided fuzzing (AFL++ through the pinned cargo-afl) of the framing tracker, the
# native engine's HTTP/1.1 parse, the two HTTP/1.1 engines against each other, the path
# normaliser and matcher, snapshot decoding and the state-file loader, 5 s per target
# from the committed corpora (proptest runs the same properties in `cargo test`). The
# 10-minute runs: data-plane/fuzz/afl.sh --seconds 600 (figures in the README and docs/security.md).
data-plane/fuzz/afl.sh --seconds 5
phase "benchmark smoke run"
# A seconds-long version of every benchmark harness (proxy against nginx and HAProxy with wrk and
# holdfast-load, fan-out, control plane at scale) with the debug binaries, so the harness
# cannot rot; criterion ran once per benchmark in `cargo test --all-targets` above. Full
# runs: tests/bench/run.sh (docs/benchmarks.md).
smoke_report=$(deploy/local/target-dir.sh)/bench-smoke.md
tests/bench/run.sh --smoke >"$smoke_report"
echo "tests/run.sh: benchmark smoke run passed (report: $smoke_report)" >&2
