#!/usr/bin/env bash
# Every benchmark, side by side in one run, as one markdown report on stdout (progress on
# stderr). docs/benchmarks.md holds the latest full report and what the figures mean.
#
#   tests/bench/run.sh            the full runs (about 25 minutes on the 2-core machine)
#   tests/bench/run.sh --smoke    seconds-long versions with the debug binaries, so the
#                                 harness cannot rot (the test command, tests/run.sh, runs
#                                 this; criterion is left out: `cargo test --all-targets`
#                                 runs each benchmark once)
#
# Sections: machine; route lookup and snapshot build (criterion); holdfast-proxy against
# nginx (wrk closed loop, oha open loop; holdfast-load in the smoke run); a route with a
# header modifier and a rewrite against nginx doing the same (filters.sh); JSON access logs
# to a file against none, holdfast and nginx (access-log.sh); route discovery fan-out of 1 MB and 10 MB
# snapshots to 1..1,000 streams; the control plane at scale (real API server, 10,000
# Ingresses, 1,000 ACKing subscribers; with deltas, then 100 EndpointSlice changes a
# second for a minute; the same with 10,000 HTTPRoutes on one Gateway); route propagation
# (a new HTTPRoute to its first 200 through a proxy, 1,000 routes present); the proxy's
# apply of a one-host delta. Installs nginx, wrk and (but for
# the smoke run) oha when missing; builds the pinned Kubernetes tools when missing (deploy/local/k8s.sh
# ensure).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
for d in "$HOME/.cargo/bin" /usr/local/go/bin; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && PATH=$PATH:$d
done
export PATH
# Where cargo puts the binaries ($CARGO_TARGET_DIR when set).
TARGET=$(deploy/local/target-dir.sh)
RELEASE=$TARGET/release
mkdir -p "$TARGET"
smoke=false
[[ ${1:-} == --smoke ]] && smoke=true
if $smoke; then
  CRITERION=(--warm-up-time 0.05 --measurement-time 0.1)
  PROXY=(--smoke)
  FANOUT=(--sizes-mb 0.1 --streams "1,20" --rounds 2)
  SCALE=(--ingresses 30 --subscribers 20 --streams-per-connection 10 --rounds 2)
  CHURN=(--churn-per-second 20 --churn-seconds 2)
  INVENTORY_STREAMS=5
  PROPAGATION=(--routes 20 --probes 5)
else
  CRITERION=()
  PROXY=()
  FANOUT=(--sizes-mb "1,10" --streams "1,100,1000" --rounds 5)
  SCALE=(--ingresses 10000 --subscribers 1000 --rounds 20)
  CHURN=(--churn-per-second 100 --churn-seconds 60)
  INVENTORY_STREAMS=100
  PROPAGATION=(--routes 1000 --probes 100)
fi
step() { echo "tests/bench/run.sh: $* ($(date -u +%T))" >&2; }

deploy/local/k8s.sh ensure >&2
if $smoke; then
  # The smoke run checks that the harness works, not the figures: it uses the debug
  # binaries the test command has built, and leaves out criterion, which
  # `cargo test --all-targets` has just run once per benchmark.
  tests/bench/tools.sh --smoke
  step building debug binaries
  cargo build -q --workspace --bins >&2
  BINS=$TARGET/debug PROFILE=debug
else
  tests/bench/tools.sh
  step building release binaries
  cargo build --release -q --workspace --bins >&2
  BINS=$RELEASE PROFILE=release
fi

echo "# holdfast benchmarks ($(date -u +%F)$($smoke && echo ', smoke run: figures mean nothing'))"
echo
echo "## Machine"
echo
echo "- $(nproc) cores: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
echo "- $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM, Linux $(uname -r)"
echo "- $(rustc --version), $PROFILE profile"
echo

# Criterion prints "name\n   time: [low median high]"; keep the median.
criterion_table() {
  python3 -c '
import re, sys
text = sys.stdin.read()
print("| benchmark | median |")
print("| --- | --- |")
rows = re.findall(r"^(\S+)\s*\n?\s+time:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", text, re.M)
for name, median in rows:
    print(f"| {name} | {median} |")
sys.exit(0 if rows else "no criterion results in the output")
'
}
if ! $smoke; then
step criterion: route lookup
echo "## Route lookup (criterion, \`cargo bench -p holdfast-data-plane --bench lookup\`)"
echo
cargo bench -q -p holdfast-data-plane --bench lookup -- "${CRITERION[@]}" 2>/dev/null | criterion_table
echo
step criterion: request path
echo "## Proxy request path without sockets (criterion, \`cargo bench -p holdfast-data-plane --bench request\`)"
echo
cargo bench -q -p holdfast-data-plane --bench request -- "${CRITERION[@]}" 2>"$TARGET/bench-request.err" | criterion_table
echo
grep '^request path:' "$TARGET/bench-request.err" || { echo "no allocation count from the request bench" >&2; exit 1; }
echo

step criterion: proxy apply
echo "## Proxy apply + persist + swap of a one-host delta (criterion, \`cargo bench -p holdfast-data-plane --bench apply\`)"
echo
cargo bench -q -p holdfast-data-plane --bench apply -- "${CRITERION[@]}" 2>/dev/null | criterion_table
echo
step criterion: snapshot build
echo "## Snapshot build (criterion, \`cargo bench -p holdfast-control-plane --bench build\`)"
echo
cargo bench -q -p holdfast-control-plane --bench build -- "${CRITERION[@]}" 2>/dev/null | criterion_table
echo
step criterion: gateway status pass
echo "## The leader's Gateway API status pass, 10,000 HTTPRoutes (criterion, \`cargo bench -p holdfast-control-plane --bench status\`)"
echo
cargo bench -q -p holdfast-control-plane --bench status -- "${CRITERION[@]}" 2>/dev/null | criterion_table
echo
fi

step proxy against nginx
tests/bench/proxy.sh "${PROXY[@]}"
echo

step filters against nginx
echo "## A route with a header modifier and a rewrite, holdfast against nginx (\`tests/bench/filters.sh\`)"
echo
if $smoke; then tests/bench/filters.sh --smoke; else tests/bench/filters.sh; fi
echo

step access log against nginx
echo "## The access log's cost, holdfast against nginx (\`tests/bench/access-log.sh\`)"
echo
if $smoke; then tests/bench/access-log.sh --smoke; else tests/bench/access-log.sh; fi
echo

step route discovery fan-out
echo "## Route discovery fan-out (\`target/$PROFILE/holdfast-bench-fanout ${FANOUT[*]}\`)"
echo
"$BINS/holdfast-bench-fanout" "${FANOUT[@]}"
echo

step control plane at scale
echo "## Control plane at scale (\`target/$PROFILE/holdfast-bench-scale ${SCALE[*]}\`)"
echo
"$BINS/holdfast-bench-scale" "${SCALE[@]}" --inventory-streams "$INVENTORY_STREAMS"
echo
echo "### The same with subscribers that accept deltas, then EndpointSlice churn (\`--deltas ${CHURN[*]}\`)"
echo
"$BINS/holdfast-bench-scale" "${SCALE[@]}" --deltas "${CHURN[@]}"
echo
echo "### The same with HTTPRoutes on one Gateway (\`--deltas --http-routes\`)"
echo
"$BINS/holdfast-bench-scale" "${SCALE[@]}" --deltas --http-routes
echo

step route propagation
echo "## Route propagation: a new HTTPRoute to its first 200 through a proxy (\`target/$PROFILE/holdfast-bench-propagation ${PROPAGATION[*]}\`)"
echo
"$BINS/holdfast-bench-propagation" "${PROPAGATION[@]}"
step "done"
