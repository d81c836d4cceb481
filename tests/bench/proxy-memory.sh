#!/usr/bin/env bash
# The memory phase of tests/bench/proxy.sh alone, to measure a change to what the proxy
# holds without the 6-minute run: a stand-in control plane serving 10,001 hosts (each "/"
# to a backend of its own), holdfast-proxy with one worker that has applied them, a wrk
# run against one of them, then the proxy's RSS and its peak (VmHWM), and the parts of the
# RSS from /proc/PID/smaps_rollup. Then the control plane replaces the whole table (every
# backend renamed, one host added) and the proxy's RSS is read once the new table is
# served and again after it has been left idle for --idle seconds: what the allocator gave
# back once the old table was freed. Markdown on stdout.
#
#   tests/bench/proxy-memory.sh [--duration S] [--connections N] [--hosts N] [--idle S]
#
# Release binaries; needs wrk, taskset and curl (installed from Debian when missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DURATION=10 CONNS=50 HOSTS=10000 IDLE=5
while (($#)); do
  case $1 in
    --duration) DURATION=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --hosts) HOSTS=$2; shift ;;
    --idle) IDLE=$2; shift ;;
    *) echo "proxy-memory.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
tests/bench/tools.sh --smoke
cargo build --release -q -p holdfast-data-plane -p holdfast-tests --bins
BIN=$(deploy/local/target-dir.sh)/release
# shellcheck source=tests/bench/common.sh
. tests/bench/common.sh
mib() { awk -v k="$2:" '$1 == k {printf "%.1f", $2 / 1024}' "$1"; }

UP=$(free_port); CP=$(free_port); HF=$(free_port); HFA=$(free_port)
taskset -c 1 "$BIN/holdfast-echo" --listen "127.0.0.1:$UP" --name bench & pids+=($!)
"$BIN/holdfast-fake-cp" --listen "127.0.0.1:$CP" --host bench.test --upstream "127.0.0.1:$UP" \
  --extra-hosts "$HOSTS" --replace-on-hup 2>/dev/null & pids+=($!)
cp_pid=$!
wait_port "$UP"; wait_port "$CP"
RUST_LOG=error taskset -c 0 "$BIN/holdfast-proxy" --access-log off --listen "127.0.0.1:$HF" \
  --admin-listen "127.0.0.1:$HFA" --debug-listen 127.0.0.1:0 --insecure-plaintext \
  --control-plane "http://127.0.0.1:$CP" --state-dir "$work/state" --node-id memory --worker-threads 1 & pids+=($!)
pid=$!
wait_port "$HF"
last="h$((HOSTS - 1)).extra.test"
[[ $HOSTS -gt 0 ]] || last=bench.test
for _ in $(seq 1 300); do curl -sf -H "Host: $last" "http://127.0.0.1:$HF/" >/dev/null && break; sleep 0.1; done
curl -sf -H "Host: $last" "http://127.0.0.1:$HF/" >/dev/null || { echo "the table never served $last" >&2; exit 1; }
loaded=$(mib "/proc/$pid/status" VmRSS)
target="h$((HOSTS / 2)).extra.test"
[[ $HOSTS -gt 0 ]] || target=bench.test
rps=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H "Host: $target" "http://127.0.0.1:$HF/" |
  awk '/Requests\/sec/ {printf "%.0f", $2}')
echo "### holdfast-proxy memory with $((HOSTS + 1)) routes ($((HOSTS + 1)) hosts and backends; wrk -c$CONNS for ${DURATION} s at $rps rps)"
echo
echo "| when | RSS | peak RSS (VmHWM) | anonymous (heap, stacks) | file-backed (the binary, shared libraries) |"
echo "| --- | --- | --- | --- | --- |"
echo "| table applied, before the load | $loaded MiB | | | |"
rollup=/proc/$pid/smaps_rollup
anon=$(mib "$rollup" Anonymous)
rss=$(mib "$rollup" Rss)
echo "| after the load | $(mib "/proc/$pid/status" VmRSS) MiB | $(mib "/proc/$pid/status" VmHWM) MiB | $anon MiB | $(python3 -c "print(f'{$rss - $anon:.1f}')") MiB |"
# The whole table replaced: the old one is freed once the new one serves.
kill -HUP "$cp_pid"
served=
for _ in $(seq 1 300); do
  curl -sf -H "Host: round1.test" "http://127.0.0.1:$HF/" >/dev/null && { served=1; break; }
  sleep 0.1
done
[[ -n $served ]] || { echo "the replaced table was never served" >&2; exit 1; }
echo "| the whole table replaced, once the new one serves | $(mib "/proc/$pid/status" VmRSS) MiB | $(mib "/proc/$pid/status" VmHWM) MiB | $(mib "$rollup" Anonymous) MiB | |"
# Left alone: no request, no push, for --idle seconds (the measured condition itself).
sleep "$IDLE"
echo "| then left idle for $IDLE s | $(mib "/proc/$pid/status" VmRSS) MiB | $(mib "/proc/$pid/status" VmHWM) MiB | $(mib "$rollup" Anonymous) MiB | |"
# One request: a worker that kept the old table (or an allocator that purges only when
# used) lets it go now.
curl -sf -H "Host: $target" "http://127.0.0.1:$HF/" >/dev/null
sleep "$IDLE"
echo "| then one request, and idle for $IDLE s | $(mib "/proc/$pid/status" VmRSS) MiB | $(mib "/proc/$pid/status" VmHWM) MiB | $(mib "$rollup" Anonymous) MiB | |"
