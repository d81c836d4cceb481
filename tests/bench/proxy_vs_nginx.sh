#!/usr/bin/env bash
# Side-by-side throughput: holdfast-proxy and nginx, each with ONE worker pinned to core 0,
# in front of the same upstream (holdfast-echo) on loopback with keep-alive on both sides;
# wrk and the upstream pinned to core 1. Runs one after the other in the same invocation,
# and prints a markdown table with the holdfast/nginx ratio.
#
#   tests/bench/proxy_vs_nginx.sh [DURATION_SECONDS] [CONNECTIONS]
#
# Needs nginx and wrk (Debian: nginx-light, wrk; installed when missing) and taskset.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DURATION=${1:-10}
CONNS=${2:-50}
for pair in nginx:nginx-light wrk:wrk taskset:util-linux; do
  command -v "${pair%%:*}" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pair#*:}"; }
done
cargo build --release -q -p holdfast-data-plane -p holdfast-tests --bins
BIN=target/release
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

UP=$(free_port); CP=$(free_port); HF=$(free_port); HFA=$(free_port); NG=$(free_port)
taskset -c 1 "$BIN/holdfast-echo" --listen "127.0.0.1:$UP" --name bench & pids+=($!)
"$BIN/holdfast-fake-cp" --listen "127.0.0.1:$CP" --host bench.test --upstream "127.0.0.1:$UP" 2>/dev/null & pids+=($!)
wait_port "$UP"; wait_port "$CP"
RUST_LOG=warn taskset -c 0 "$BIN/holdfast-proxy" --listen "127.0.0.1:$HF" --admin-listen "127.0.0.1:$HFA" \
  --control-plane "http://127.0.0.1:$CP" --state-dir "$work/state" --node-id bench --worker-threads 1 & pids+=($!)
cat >"$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream echo { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$NG;
    location / {
      proxy_pass http://echo;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
  }
}
NGINX
taskset -c 0 nginx -c "$work/nginx.conf" -e "$work/nginx-error.log" & pids+=($!)
wait_port "$HF"; wait_port "$NG"
for _ in $(seq 1 100); do curl -sf -H 'Host: bench.test' "http://127.0.0.1:$HF/" >/dev/null && break; sleep 0.1; done

run() { # name port -> "rps p50 p99"
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -H 'Host: bench.test' "http://127.0.0.1:$2/" >"$work/$1.wrk"
  local rps p50 p99 errs
  rps=$(awk '/Requests\/sec/ {print $2}' "$work/$1.wrk")
  p50=$(awk '$1=="50%" {print $2}' "$work/$1.wrk")
  p99=$(awk '$1=="99%" {print $2}' "$work/$1.wrk")
  errs=$(awk '/Non-2xx|Socket errors/ {print}' "$work/$1.wrk" | tr '\n' ' ')
  echo "$rps|$p50|$p99|${errs:-none}"
}
# Warm both, then measure.
taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H 'Host: bench.test' "http://127.0.0.1:$HF/" >/dev/null
taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H 'Host: bench.test' "http://127.0.0.1:$NG/" >/dev/null
hf=$(run holdfast "$HF"); ng=$(run nginx "$NG")
ratio=$(python3 -c "print(f'{float(\"${hf%%|*}\")/float(\"${ng%%|*}\"):.2f}')")
echo
echo "wrk -t1 -c$CONNS -d${DURATION}s, one proxy worker pinned to core 0 ($(date -u +%F))"
echo
echo "| proxy | requests/s | p50 | p99 | errors |"
echo "| --- | --- | --- | --- | --- |"
echo "| holdfast-proxy | ${hf//|/ | } |"
echo "| nginx $(nginx -v 2>&1 | sed 's/.*\///') | ${ng//|/ | } |"
echo
echo "holdfast/nginx throughput ratio: $ratio"
