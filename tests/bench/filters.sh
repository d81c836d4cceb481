#!/usr/bin/env bash
# What a rule's filters cost, against nginx doing the same, side by side in one run: a
# route with no filter, and one with a request header modifier (set one header, add one,
# remove one) and a prefix rewrite (/api -> /v2), on holdfast-proxy (a Gateway listener
# of holdfast-fake-cp --filters-listen, one worker thread) and on nginx (one worker
# process, proxy_set_header and rewrite ... break), each pinned to core 0; the upstream
# (holdfast-echo) and wrk on core 1. Each pair of runs alternates holdfast and nginx over
# --rounds rounds, and the medians are printed, with the holdfast/nginx ratio for each
# route. Markdown on stdout.
#
#   tests/bench/filters.sh [--smoke] [--duration S] [--connections N] [--rounds N]
#
# --smoke: debug binaries, one short round: checks the harness (both proxies answer each
# route as configured), not the figures.
#
# Needs nginx, wrk and taskset (installed from Debian when missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/side-by-side.sh
. tests/bench/side-by-side.sh filters.sh 3 "$@"
# shellcheck source=tests/bench/common.sh
. tests/bench/common.sh

UP=$(free_port); CP=$(free_port); HF=$(free_port); HFA=$(free_port); GW=$(free_port); NG=$(free_port)
taskset -c 1 "$BIN/holdfast-echo" --listen "127.0.0.1:$UP" --name bench & pids+=($!)
"$BIN/holdfast-fake-cp" --listen "127.0.0.1:$CP" --host bench.test --upstream "127.0.0.1:$UP" \
  --filters-listen "127.0.0.1:$GW" 2>/dev/null & pids+=($!)
wait_port "$UP"; wait_port "$CP"
RUST_LOG=error taskset -c 0 "$BIN/holdfast-proxy" --access-log off --listen "127.0.0.1:$HF" \
  --admin-listen "127.0.0.1:$HFA" --debug-listen 127.0.0.1:0 --insecure-plaintext \
  --control-plane "http://127.0.0.1:$CP" --state-dir "$work/state" --node-id bench --worker-threads 1 & pids+=($!)
hf_pid=$!
cat >"$work/nginx.conf" <<NGINX
worker_processes 1;
master_process off;
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
      # What holdfast-proxy sends upstream (common.sh).
      include $work/forwarding.conf;
    }
    location /api {
      # The same filters: set one header, add one, remove one, and the prefix rewrite.
      proxy_set_header X-Tenant blue;
      proxy_set_header X-Via holdfast;
      proxy_set_header X-Request-Id "";
      rewrite ^/api(/.*)?\$ /v2\$1 break;
      proxy_pass http://echo;
      include $work/forwarding.conf;
    }
  }
}
NGINX
taskset -c 0 nginx -c "$work/nginx.conf" -e "$work/nginx-error.log" & pids+=($!)
wait_port "$HF"; wait_port "$NG"
for _ in $(seq 1 100); do curl -sf -H 'Host: bench.test' "http://127.0.0.1:$GW/" >/dev/null && break; sleep 0.1; done

# Each proxy serves each route as configured: the header set and removed, the path
# rewritten, and the plain route untouched.
check() { # NAME PORT
  local head
  head=$(curl -sf -D - -o /dev/null -H 'Host: bench.test' -H 'X-Request-Id: abc' "http://127.0.0.1:$2/api/users/42?page=2") ||
    { echo "$1 does not answer /api" >&2; exit 1; }
  grep -qi '^x-echo-path: /v2/users/42?page=2' <<<"$head" || { echo "$1 did not rewrite: $head" >&2; exit 1; }
  grep -i '^x-echo-headers:' <<<"$head" | grep -qi 'x-tenant' || { echo "$1 did not set x-tenant: $head" >&2; exit 1; }
  if grep -i '^x-echo-headers:' <<<"$head" | grep -qi 'x-request-id'; then
    echo "$1 did not remove x-request-id: $head" >&2; exit 1
  fi
  head=$(curl -sf -D - -o /dev/null -H 'Host: bench.test' "http://127.0.0.1:$2/users/42") ||
    { echo "$1 does not answer /" >&2; exit 1; }
  grep -qi '^x-echo-path: /users/42' <<<"$head" || { echo "$1 changed the plain route: $head" >&2; exit 1; }
}
check holdfast "$GW"
check nginx "$NG"

rps() { # PORT PATH: requests per second over DURATION, wrk closed loop
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Host: bench.test' -H 'X-Request-Id: abc' \
    "http://127.0.0.1:$1$2" | awk '/Requests\/sec/ {printf "%.0f", $2}'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }

declare -A runs
for round in $(seq 1 "$ROUNDS"); do
  for route in plain filtered; do
    path=/users/42; [[ $route == filtered ]] && path=/api/users/42
    # Alternate which proxy goes first, so a drift of the machine falls on both.
    order=(holdfast nginx); ((round % 2 == 0)) && order=(nginx holdfast)
    for proxy in "${order[@]}"; do
      port=$GW; [[ $proxy == nginx ]] && port=$NG
      runs[$proxy-$route]+="$(rps "$port" "$path") "
    done
  done
done
kill -0 "$hf_pid" || { echo "holdfast-proxy exited" >&2; exit 1; }

printf '| route | holdfast rps (median of %s) | nginx rps | holdfast/nginx |\n| --- | ---: | ---: | ---: |\n' "$ROUNDS"
for route in plain filtered; do
  h=$(tr ' ' '\n' <<<"${runs[holdfast-$route]}" | grep . | median)
  n=$(tr ' ' '\n' <<<"${runs[nginx-$route]}" | grep . | median)
  ((h > 0 && n > 0)) || { echo "no figures for $route (holdfast $h, nginx $n)" >&2; exit 1; }
  printf '| %s | %s | %s | %s |\n' "$route" "$h" "$n" "$(awk -v h="$h" -v n="$n" 'BEGIN {printf "%.2f", h / n}')"
done
printf '\nEach run: wrk -t1 -c%s -d%ss, %s rounds; runs per route (holdfast): plain %s; filtered %s\n' \
  "$CONNS" "$DURATION" "$ROUNDS" "${runs[holdfast-plain]}" "${runs[holdfast-filtered]}"
