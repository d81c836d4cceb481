#!/usr/bin/env bash
# What the access log costs, against what nginx's costs, side by side in one run:
# holdfast-proxy with `--access-log off` and with JSON lines to a file (the default
# format), and nginx with `access_log off` and with a JSON `log_format` to a file (the same
# fields: time, client, request, status, bytes, durations, upstream, request id, referer,
# user agent). Each proxy runs with one worker (thread or process) pinned to core 0; the
# upstream (holdfast-echo) and wrk on core 1. Each round runs the four in a rotating order
# (so a drift of the machine falls on each), and the medians over --rounds are printed with
# the logged/unlogged ratio of each proxy. The issue's target: holdfast's ratio at least
# 0.9 and at least nginx's. Markdown on stdout.
#
#   tests/bench/access-log.sh [--smoke] [--duration S] [--connections N] [--rounds N]
#
# --smoke: debug binaries, one short round: checks the harness (each proxy answers, and
# the logged ones write one well-formed line per request), not the figures.
#
# Needs nginx, wrk and taskset (installed from Debian when missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/side-by-side.sh
. tests/bench/side-by-side.sh access-log.sh 5 "$@"
# shellcheck source=tests/bench/common.sh
. tests/bench/common.sh

UP=$(free_port); CP=$(free_port)
HF_OFF=$(free_port); HF_ON=$(free_port); HFA_OFF=$(free_port); HFA_ON=$(free_port)
NG_OFF=$(free_port); NG_ON=$(free_port)
taskset -c 1 "$BIN/holdfast-echo" --listen "127.0.0.1:$UP" --name bench & pids+=($!)
"$BIN/holdfast-fake-cp" --listen "127.0.0.1:$CP" --host bench.test --upstream "127.0.0.1:$UP" \
  2>/dev/null & pids+=($!)
wait_port "$UP"; wait_port "$CP"
holdfast() { # PORT ADMIN_PORT NAME ACCESS_LOG
  RUST_LOG=error taskset -c 0 "$BIN/holdfast-proxy" --access-log "$4" --listen "127.0.0.1:$1" \
    --admin-listen "127.0.0.1:$2" --debug-listen 127.0.0.1:0 --insecure-plaintext \
    --control-plane "http://127.0.0.1:$CP" --state-dir "$work/state-$3" --node-id "bench-$3" \
    --worker-threads 1 & pids+=($!)
}
holdfast "$HF_OFF" "$HFA_OFF" off off
holdfast "$HF_ON" "$HFA_ON" on "$work/holdfast-access.log"
nginx_conf() { # NAME PORT ACCESS_LOG_DIRECTIVE
  cat <<NGINX
worker_processes 1;
master_process off;
daemon off;
pid $work/nginx-$1.pid;
error_log $work/nginx-$1-error.log warn;
events { worker_connections 4096; }
http {
  log_format json escape=json '{"time":"\$time_iso8601","client":"\$remote_addr",'
    '"method":"\$request_method","host":"\$host","path":"\$uri","protocol":"\$server_protocol",'
    '"status":\$status,"bytes_received":\$request_length,"bytes_sent":\$bytes_sent,'
    '"duration_ms":\$request_time,"upstream_duration_ms":"\$upstream_response_time",'
    '"upstream":"\$upstream_addr","request_id":"\$request_id","referer":"\$http_referer",'
    '"user_agent":"\$http_user_agent"}';
  $3
  upstream echo { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$2;
    location / {
      proxy_pass http://echo;
      # What holdfast-proxy sends upstream (common.sh), and the request id.
      include $work/forwarding.conf;
      proxy_set_header X-Request-Id \$request_id;
    }
  }
}
NGINX
}
nginx_conf off "$NG_OFF" 'access_log off;' >"$work/nginx-off.conf"
nginx_conf on "$NG_ON" "access_log $work/nginx-access.log json;" >"$work/nginx-on.conf"
for n in off on; do
  taskset -c 0 nginx -c "$work/nginx-$n.conf" -e "$work/nginx-$n-error.log" & pids+=($!)
done
for port in "$HF_OFF" "$HF_ON" "$NG_OFF" "$NG_ON"; do
  wait_port "$port"
  for _ in $(seq 1 100); do curl -sf -H 'Host: bench.test' "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done
  curl -sf -H 'Host: bench.test' "http://127.0.0.1:$port/" >/dev/null || { echo "port $port never served" >&2; exit 1; }
done

rps() { # PORT: requests per second over DURATION, wrk closed loop
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Host: bench.test' -H 'User-Agent: wrk' \
    "http://127.0.0.1:$1/" | awk '/Requests\/sec/ {printf "%.0f", $2}'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
lines() { if [[ -f $1 ]]; then wc -l <"$1"; else echo 0; fi; }

names=(holdfast-off holdfast-on nginx-off nginx-on)
ports=("$HF_OFF" "$HF_ON" "$NG_OFF" "$NG_ON")
declare -A runs
for ((round = 0; round < ROUNDS; round++)); do
  for k in 0 1 2 3; do
    i=$(((round + k) % 4))
    runs[${names[i]}]+="$(rps "${ports[i]}") "
  done
done

# The logged ones wrote what they served: one JSON line per request (holdfast's counted
# drops, lines the writer could not keep up with, are reported beside the figures).
hf_lines=$(lines "$work/holdfast-access.log")
ng_lines=$(lines "$work/nginx-access.log")
dropped=$(curl -sf "http://127.0.0.1:$HFA_ON/metrics" | awk '/^holdfast_proxy_access_log_dropped_total / {print $2}')
[[ -n $dropped ]] || { echo "no holdfast_proxy_access_log_dropped_total series" >&2; exit 1; }
((hf_lines > 0 && ng_lines > 0)) || { echo "a logged proxy wrote no lines (holdfast $hf_lines, nginx $ng_lines)" >&2; exit 1; }
python3 - "$work/holdfast-access.log" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    for n, line in enumerate(f, 1):
        r = json.loads(line)
        for field in ("time", "client", "method", "path", "status", "request_id", "upstream"):
            if field not in r:
                sys.exit(f"line {n} has no {field}: {line}")
PY

med() { tr ' ' '\n' <<<"${runs[$1]}" | grep . | median; }
h0=$(med holdfast-off); h1=$(med holdfast-on); n0=$(med nginx-off); n1=$(med nginx-on)
for v in "$h0" "$h1" "$n0" "$n1"; do ((v > 0)) || { echo "a run gave no figure: ${runs[*]}" >&2; exit 1; }; done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '| proxy | log off rps (median of %s) | JSON log to a file rps | logged/unlogged |\n| --- | ---: | ---: | ---: |\n' "$ROUNDS"
printf '| holdfast-proxy | %s | %s | %s |\n' "$h0" "$h1" "$(ratio "$h1" "$h0")"
printf '| nginx %s | %s | %s | %s |\n' "$(nginx -v 2>&1 | sed 's/.*\///')" "$n0" "$n1" "$(ratio "$n1" "$n0")"
printf '\nEach run: wrk -t1 -c%s -d%ss, %s rounds, the four in a rotating order. Lines written: holdfast %s (dropped and counted: %s), nginx %s.\n' \
  "$CONNS" "$DURATION" "$ROUNDS" "$hf_lines" "$dropped" "$ng_lines"
printf 'Runs: holdfast off %s; on %s; nginx off %s; on %s\n' \
  "${runs[holdfast-off]}" "${runs[holdfast-on]}" "${runs[nginx-off]}" "${runs[nginx-on]}"
