#!/usr/bin/env bash
# holdfast-proxy against nginx and HAProxy, side by side in one run: the same upstream
# (holdfast-echo, a small hyper server) on loopback with keep-alive on both sides;
# holdfast-proxy with one worker thread, nginx with one worker process and HAProxy with one
# thread, each pinned to core 0 in turn; the load generator and the upstream pinned to
# core 1.
#
# - closed loop, maximum throughput: wrk (Debian)
# - open loop at fixed rates with latency correction: oha (crates.io) -q RATE --latency-correction;
#   with --smoke, holdfast-load (tests/src/bin, the same JSON), so the test command needs no
#   oha (whose install builds SQLite for minutes)
#
# For each run: achieved rps, p50/p99/p99.9, errors, proxy CPU % (utime+stime over wall
# time, from /proc) and proxy RSS (VmHWM), and the holdfast/nginx ratio. Markdown on stdout.
#
# HTTPS, the same way: both serve the same ECDSA P-256 certificate (holdfast-dev-certs),
# TLS 1.3, a session cache and tickets on both; wrk over keep-alive TLS connections, and
# new TLS handshakes per second with `openssl s_time` (-new: full handshakes, resumption
# off; -reuse: resumed sessions).
#
#   tests/bench/proxy.sh [--smoke] [--duration S] [--connections N] [--rates R1,R2,...]
#                        [--flamegraph FILE.svg] [--syscalls] [--kernel] [--kernel-rates R1,R2,...]
#                        [--profile-only] [--latency-rounds N] [--two-core-rounds N]
#
# --flamegraph also records holdfast-proxy with perf (DWARF call graphs) during one more
# wrk run and renders FILE.svg with inferno (installed with cargo when missing), keeping
# the folded stacks beside it (FILE.folded). --syscalls also counts each proxy's system
# calls per request (perf stat, raw_syscalls:sys_enter) over one more wrk run each.
# --kernel also samples holdfast-proxy and nginx (perf record, no call graphs) over one
# more wrk run each, and prints the time per request in user space, in the kernel, and in
# the kernel functions that take the most, side by side, with what the upstream and the
# load generator's core spent per request meanwhile.
# --latency-rounds N repeats the open-loop runs at each of --rates N times, the three
# proxies and a run straight to the upstream (no proxy: the harness's own tail) in a
# rotating order each round (so that a drift of the machine falls on each), and prints
# each one's median, lowest and highest p99 and its median p99.9 over the rounds: the
# tail, which one run gives a single noisy sample of. Runs with --profile-only too.
# --two-core-rounds N repeats the two-workers-on-two-cores closed-loop runs N times, the
# three proxies in a rotating order, and prints for each run where the machine's CPU went
# per request (the proxy, the upstream, the rest: wrk and the kernel) and its idle share,
# then the medians and the median ratios. Runs with --profile-only too.
#
# Needs nginx, haproxy, wrk, taskset (installed from Debian when missing) and, but for --smoke,
# oha (cargo install when missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DURATION=10 CONNS=50 RATES=5000,10000,20000,40000 FLAME='' SMOKE='' SYSCALLS='' KERNEL='' KRATES='' PROFILE_ONLY='' LAT_ROUNDS='' TWO_ROUNDS=''
while (($#)); do
  case $1 in
    --flamegraph) FLAME=$(realpath -m "$2"); shift ;;
    --syscalls) SYSCALLS=1 ;;
    --kernel) KERNEL=1 ;;
    --kernel-rates) KRATES=$2; shift ;;
    --profile-only) PROFILE_ONLY=1 ;;
    --latency-rounds) LAT_ROUNDS=$2; shift ;;
    --two-core-rounds) TWO_ROUNDS=$2; shift ;;
    --smoke) DURATION=1 CONNS=10 RATES=1000 SMOKE=--smoke ;;
    --duration) DURATION=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --rates) RATES=$2; shift ;;
    *) echo "proxy.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
tests/bench/tools.sh $SMOKE
PATH=$HOME/.cargo/bin:$PATH
if [[ -n $SMOKE ]]; then
  # The smoke run checks that the harness works, not the figures: the debug binaries the
  # test command has built already, and holdfast-load for the open-loop runs.
  cargo build -q -p holdfast-data-plane -p holdfast-tests --bins
  BIN=$(deploy/local/target-dir.sh)/debug
  LOAD=holdfast-load
else
  cargo build --release -q -p holdfast-data-plane -p holdfast-tests --bins
  BIN=$(deploy/local/target-dir.sh)/release
  LOAD=oha
fi
# The open-loop command for PORT RATE, into the array `load`.
load_open_loop() {
  if [[ $LOAD == oha ]]; then
    load=(oha --no-tui --output-format json -z "${DURATION}s" -c "$CONNS" -q "$2" --latency-correction
      -H 'Host: bench.test' "http://127.0.0.1:$1/")
  else
    load=("$BIN/holdfast-load" -z "${DURATION}s" -c "$CONNS" -q "$2" --host bench.test "http://127.0.0.1:$1/")
  fi
}
# shellcheck source=tests/bench/common.sh
. tests/bench/common.sh

UP=$(free_port); CP=$(free_port); HF=$(free_port); HFA=$(free_port); NG=$(free_port)
HFS=$(free_port); NGS=$(free_port); HP=$(free_port); HPS=$(free_port)
"$BIN/holdfast-dev-certs" --out "$work/pki" --host bench.test >/dev/null
# HAProxy takes the certificate and its key in one file.
cat "$work/pki/site.crt" "$work/pki/site.key" >"$work/pki/site.pem"
taskset -c 1 "$BIN/holdfast-echo" --listen "127.0.0.1:$UP" --name bench & pids+=($!)
up_pid=$!
"$BIN/holdfast-fake-cp" --listen "127.0.0.1:$CP" --host bench.test --upstream "127.0.0.1:$UP" \
  --tls-cert "$work/pki/site.crt" --tls-key "$work/pki/site.key" 2>/dev/null & pids+=($!)
wait_port "$UP"; wait_port "$CP"
# Plaintext to the stand-in control plane: the benchmark measures the proxy's client side.
RUST_LOG=error taskset -c 0 "$BIN/holdfast-proxy" --access-log off --listen "127.0.0.1:$HF" --listen-tls "127.0.0.1:$HFS" \
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
    listen 127.0.0.1:$NGS ssl;
    ssl_certificate $work/pki/site.crt;
    ssl_certificate_key $work/pki/site.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;
    ssl_session_tickets on;
    location / {
      proxy_pass http://echo;
      # What holdfast-proxy sends upstream (common.sh).
      include $work/forwarding.conf;
    }
  }
}
NGINX
# master_process off: the one nginx process is the worker, so its CPU and RSS are nginx's.
taskset -c 0 nginx -c "$work/nginx.conf" -e "$work/nginx-error.log" & pids+=($!)
ng_pid=$!
# HAProxy: one process (no master-worker), NBTHREAD threads; keep-alive to the upstream
# with idle connections reused by any client (http-reuse always), as nginx's keepalive
# pool; TLS 1.2 and 1.3 with its default session cache and tickets; no logging.
haproxy_conf() { # NBTHREAD PORT [TLS_PORT]
  cat <<HAPROXY
global
  nbthread $1
  maxconn 8192
  pidfile $work/haproxy-$2.pid
  ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
  option forwardfor
  http-reuse always
frontend bench
  bind 127.0.0.1:$2
${3:+  bind 127.0.0.1:$3 ssl crt $work/pki/site.pem}
  # The forwarding headers holdfast-proxy sends (as nginx's above).
  http-request set-var(txn.proto) str(http)
  http-request set-var(txn.proto) str(https) if { ssl_fc }
  http-request set-header X-Forwarded-Proto %[var(txn.proto)]
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-request set-header X-Forwarded-Port %[dst_port]
  http-request set-header X-Real-IP %[src]
  http-request set-header Forwarded for=%[src];host=%[req.hdr(host)];proto=%[var(txn.proto)]
  http-request set-header X-Bench-Loop 0123456789abcdef
  default_backend echo
backend echo
  server echo 127.0.0.1:$UP
HAPROXY
}
haproxy_conf 1 "$HP" "$HPS" >"$work/haproxy.cfg"
haproxy -c -q -f "$work/haproxy.cfg" || { echo "haproxy rejected its configuration" >&2; exit 1; }
taskset -c 0 haproxy -db -f "$work/haproxy.cfg" & pids+=($!)
hp_pid=$!
wait_port "$HF"; wait_port "$NG"; wait_port "$HP"
for _ in $(seq 1 100); do curl -sf -H 'Host: bench.test' "http://127.0.0.1:$HF/" >/dev/null && break; sleep 0.1; done
curl -sf -H 'Host: bench.test' "http://127.0.0.1:$HF/" >/dev/null || { echo "holdfast-proxy never served the route" >&2; exit 1; }
curl -sf -H 'Host: bench.test' "http://127.0.0.1:$NG/" >/dev/null || { echo "nginx never served" >&2; exit 1; }
curl -sf -H 'Host: bench.test' "http://127.0.0.1:$HP/" >/dev/null || { echo "haproxy never served" >&2; exit 1; }
for port in "$HFS" "$NGS" "$HPS"; do
  curl -sf --cacert "$work/pki/ca.crt" --resolve "bench.test:$port:127.0.0.1" "https://bench.test:$port/" >/dev/null ||
    { echo "no HTTPS on port $port" >&2; exit 1; }
done

TICKS=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hwm_mib() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }

# measure PID CMD...: runs CMD, prints "cpu% rss_mib" of PID over the run to fd 3.
measure() {
  local pid=$1; shift
  local t0 c0 t1 c1
  t0=$(date +%s.%N); c0=$(cpu_ticks "$pid")
  "$@"
  t1=$(date +%s.%N); c1=$(cpu_ticks "$pid")
  python3 -c "print(f'{($c1 - $c0) / $TICKS / ($t1 - $t0) * 100:.0f}%', '$(hwm_mib "$pid") MiB')" >&3
}

# wrk closed loop: "rps|p50|p99|p99.9|errors|cpu|rss" (SCHEME: http, or https)
wrk_run() {
  local name=$1 port=$2 pid=$3 scheme=${4:-http} usage
  usage=$(measure "$pid" taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -H 'Host: bench.test' \
    "$scheme://127.0.0.1:$port/" 3>&1 >"$work/$name.wrk")
  python3 - "$work/$name.wrk" "$usage" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
def pct(p):
    m = re.search(rf"^\s+{p}%\s+(\S+)", text, re.M)
    return m.group(1) if m else "—"
errs = "; ".join(l.strip() for l in text.splitlines() if "Non-2xx" in l or "Socket errors" in l) or "0"
cpu, rss = sys.argv[2].split(" ", 1)
print(f"{rps:.0f}|{pct(50)}|{pct(99)}|—|{errs}|{cpu}|{rss}")
PY
}

# Open loop at a fixed rate (oha, or holdfast-load in the smoke run; the same JSON):
# "rps|p50|p99|p99.9|errors|cpu|rss"
oha_run() {
  local name=$1 port=$2 pid=$3 rate=$4 usage load
  load_open_loop "$port" "$rate"
  usage=$(measure "$pid" taskset -c 1 "${load[@]}" 3>&1 >"$work/$name-$rate.json")
  python3 - "$work/$name-$rate.json" "$usage" "$SMOKE" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
# The smoke run checks the harness: every request must have been answered 2xx.
if sys.argv[3] and (r["summary"]["requestsPerSec"] <= 0 or r.get("errorDistribution", {}).keys() - {"aborted due to deadline"}
                    or any(not c.startswith("2") for c in r.get("statusCodeDistribution", {}))):
    sys.exit(f"smoke: open-loop run failed: {json.dumps(r)}")
s, p = r["summary"], r["latencyPercentiles"]
ms = lambda v: "—" if v is None else f"{v * 1000:.2f}ms"
codes = r.get("statusCodeDistribution", {})
bad = sum(n for c, n in codes.items() if not c.startswith("2"))
# Requests still in flight when the run's time is up are not failures.
errors = dict(r.get("errorDistribution", {}))
cut = errors.pop("aborted due to deadline", 0)
errs = "; ".join(f"{n} {e}" for e, n in errors.items()) or "0"
cpu, rss = sys.argv[2].split(" ", 1)
print(f"{s['requestsPerSec']:.0f}|{ms(p['p50'])}|{ms(p['p99'])}|{ms(p['p99.9'])}|{bad} non-2xx, errors: {errs} ({cut} cut at the end)|{cpu}|{rss}")
PY
}

# openssl s_time: TLS handshakes per second, "rate|cpu|cpu per handshake|rss|resumed"
# (MODE: "-new" for full handshakes, "-reuse" to resume the first session; extra s_time
# flags may follow, such as -tls1_2). s_time prints one mark per connection: "r" for a
# resumed session, so the share of resumed handshakes is counted, not assumed.
stime_run() {
  local name=$1 port=$2 pid=$3 usage tag; shift 3
  tag=$(echo "$*" | tr -d ' -')
  usage=$(measure "$pid" taskset -c 1 openssl s_time -connect "127.0.0.1:$port" "$@" -time "$DURATION" \
    -CAfile "$work/pki/ca.crt" 3>&1 >"$work/$name-$tag.stime" 2>&1)
  python3 - "$work/$name-$tag.stime" "$usage" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"(\d+) connections in ([\d.]+)s;", text)
count, secs = int(m.group(1)), float(m.group(2))
rate = count / secs
marks = "".join(l for l in text.splitlines() if re.fullmatch(r"[r*0-9a-zA-Z]+", l.strip() or "x") and "connections" not in l)
resumed = marks.count("r")
cpu, rss = sys.argv[2].split(" ", 1)
per = float(cpu.rstrip("%")) / 100 / rate * 1e6 if rate else 0
print(f"{rate:.0f}|{cpu}|{per:.0f} µs|{rss}|{resumed * 100 // max(len(marks), 1)}%")
PY
}

row() { local name=$1 line=$2; echo "| $name | ${line//|/ | } |"; }
ratio() { python3 -c "a, b = float(\"${1%%|*}\"), float(\"${2%%|*}\"); print(f'{a / b:.2f}' if b else '—')"; }

# Warm all three.
for port in "$HF" "$NG" "$HP"; do
  taskset -c 1 wrk -t1 -c"$CONNS" -d1s -H 'Host: bench.test' "http://127.0.0.1:$port/" >/dev/null
done

nginx_version=$(nginx -v 2>&1 | sed 's/.*\///')
haproxy_version=$(haproxy -v | awk 'NR == 1 {print $3}')
if [[ -z $PROFILE_ONLY ]]; then
  echo "### Proxy against nginx and HAProxy ($(date -u +%F), ${DURATION} s per run, $CONNS connections)"
  echo
  echo "| load | proxy | achieved rps | p50 | p99 | p99.9 | errors | proxy CPU | proxy peak RSS | holdfast/nginx rps | holdfast/HAProxy rps |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  hf=$(wrk_run holdfast "$HF" "$hf_pid"); ng=$(wrk_run nginx "$NG" "$ng_pid"); hp=$(wrk_run haproxy "$HP" "$hp_pid")
  echo "| wrk closed loop (max) | holdfast-proxy | ${hf//|/ | } | $(ratio "$hf" "$ng") | $(ratio "$hf" "$hp") |"
  echo "| wrk closed loop (max) | nginx $nginx_version | ${ng//|/ | } | | |"
  echo "| wrk closed loop (max) | HAProxy $haproxy_version | ${hp//|/ | } | | |"
  IFS=, read -ra rates <<<"$RATES"
  for rate in "${rates[@]}"; do
    hf=$(oha_run holdfast "$HF" "$hf_pid" "$rate"); ng=$(oha_run nginx "$NG" "$ng_pid" "$rate")
    hp=$(oha_run haproxy "$HP" "$hp_pid" "$rate")
    echo "| $LOAD open loop $rate rps | holdfast-proxy | ${hf//|/ | } | $(ratio "$hf" "$ng") | $(ratio "$hf" "$hp") |"
    echo "| $LOAD open loop $rate rps | nginx $nginx_version | ${ng//|/ | } | | |"
    echo "| $LOAD open loop $rate rps | HAProxy $haproxy_version | ${hp//|/ | } | | |"
  done
  echo
  echo "wrk $(wrk -v 2>&1 | awk 'NR == 1 {print $2}'), $([[ $LOAD == oha ]] && oha --version || echo holdfast-load), nginx $nginx_version: \`worker_processes 1; master_process off\`, upstream keepalive 128; HAProxy $haproxy_version: \`nbthread 1\`, \`http-reuse always\`; holdfast-proxy \`--worker-threads 1\`."
fi

if [[ -n $LAT_ROUNDS ]]; then
  echo
  echo "### The tail over $LAT_ROUNDS rounds ($LOAD open loop, ${DURATION} s per run, $CONNS connections; the three proxies and the upstream alone, in a rotating order)"
  echo
  IFS=, read -ra rates <<<"$RATES"
  # (not `pids`: the cleanup on exit stops the processes that array names)
  # `direct`: the load sent to the upstream itself, no proxy between: the harness's own tail.
  lat_names=(holdfast nginx haproxy direct) lat_ports=("$HF" "$NG" "$HP" "$UP")
  lat_pids=("$hf_pid" "$ng_pid" "$hp_pid" "$up_pid")
  # run_delay PID: nanoseconds its threads have spent runnable but waiting for a CPU
  # (/proc/PID/task/*/schedstat, second field): the scheduling part of the tail.
  run_delay() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{t += $2} END {printf "%d", t}'; }
  : >"$work/tail"
  for ((round = 0; round < LAT_ROUNDS; round++)); do
    for rate in "${rates[@]}"; do
      for k in 0 1 2 3; do
        i=$(((round + k) % 4))
        waited=$(run_delay "${lat_pids[i]}")
        line=$(oha_run "${lat_names[i]}" "${lat_ports[i]}" "${lat_pids[i]}" "$rate")
        waited=$(($(run_delay "${lat_pids[i]}") - waited))
        echo "$rate ${lat_names[i]} $line|$waited" >>"$work/tail"
      done
    done
  done
  python3 - "$work/tail" "$nginx_version" "$haproxy_version" "$DURATION" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    rate, name, fields = line.split(" ", 2)
    f = fields.strip().split("|")
    ms = lambda v: float(v.rstrip("ms")) if v.endswith("ms") else None
    if ms(f[2]) is None:
        sys.exit(f"a run at {rate} rps through {name} gave no p99: {fields}")
    runs.setdefault((int(rate), name), []).append((float(f[0]), ms(f[2]), ms(f[3]), int(f[-1])))
label = {"holdfast": "holdfast-proxy", "nginx": f"nginx {sys.argv[2]}", "haproxy": f"HAProxy {sys.argv[3]}",
         "direct": "no proxy (to the upstream itself)"}
print("| rate | proxy | rounds | achieved rps (median) | p99 median | p99 lowest | p99 highest | p99 of each round | p99.9 median | run-queue wait per request (median) | holdfast/nginx p99 (medians) | holdfast/HAProxy p99 (medians) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for rate in sorted({r for r, _ in runs}):
    med = {n: statistics.median(p99 for _, p99, _, _ in runs[(rate, n)]) for n in label}
    for n in label:
        rs = runs[(rate, n)]
        p99s = [p for _, p, _, _ in rs]
        p999 = [p for _, _, p, _ in rs if p is not None]
        wait = statistics.median(w / (r * float(sys.argv[4])) for r, _, _, w in rs)
        ratios = f"{med['holdfast'] / med['nginx']:.2f} | {med['holdfast'] / med['haproxy']:.2f}" if n == "holdfast" else " | "
        tail = f"{statistics.median(p999):.2f}ms" if p999 else "—"
        rps = statistics.median(r for r, _, _, _ in rs)
        each = ", ".join(f"{p:.2f}" for p in p99s)
        print(f"| {rate} | {label[n]} | {len(rs)} | {rps:.0f} | {med[n]:.2f}ms | {min(p99s):.2f}ms | {max(p99s):.2f}ms | {each} | {tail} | {wait:.0f} ns | {ratios} |")
PY
fi

if [[ -n $SYSCALLS ]]; then
  command -v perf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >&2; }
  # syscalls_run PORT PID: "requests|system calls|per request" over a wrk run.
  syscalls_run() {
    perf stat -e raw_syscalls:sys_enter -x, -o "$work/perf-stat" -p "$2" -- sleep "$((DURATION + 1))" &
    local perf_pid=$! out
    out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Host: bench.test' "http://127.0.0.1:$1/")
    wait "$perf_pid"
    python3 - "$out" "$work/perf-stat" <<'PY'
import re, sys
requests = int(re.search(r"(\d+) requests in", sys.argv[1]).group(1))
calls = next(int(l.split(",")[0]) for l in open(sys.argv[2]) if "raw_syscalls:sys_enter" in l)
print(f"{requests}|{calls}|{calls / requests:.2f}")
PY
  }
  echo
  echo "### System calls per request (perf stat -e raw_syscalls:sys_enter, wrk -c$CONNS for ${DURATION} s, one worker each)"
  echo
  echo "| proxy | requests | system calls | per request |"
  echo "| --- | --- | --- | --- |"
  echo "| holdfast-proxy | $(syscalls_run "$HF" "$hf_pid" | sed 's/|/ | /g') |"
  echo "| nginx $nginx_version | $(syscalls_run "$NG" "$ng_pid" | sed 's/|/ | /g') |"
  echo "| HAProxy $haproxy_version | $(syscalls_run "$HP" "$hp_pid" | sed 's/|/ | /g') |"
fi

if [[ -n $KERNEL || -n $KRATES ]]; then
  command -v perf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >&2; }
  # threads PID: a line per thread, "name cpu_ticks voluntary_switches involuntary_switches".
  threads() {
    local task
    for task in /proc/"$1"/task/*; do
      { awk '{sub(/^[^)]*\) /, ""); printf "%s ", $12 + $13}' "$task/stat"
        awk '/^Name:/ {n = $2} /^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {i = $2} END {print v, i, n}' "$task/status"
      } 2>/dev/null || true
    done
  }
  # kernel_run PORT PID NAME [RATE]: samples PID over a wrk run (or an open-loop run at
  # RATE); writes NAME's requests, CPU seconds, threads and perf's per-symbol shares into
  # $work/kernel-NAME.*.
  kernel_run() {
    local ticks_before up_before core1_before out perf_pid
    ticks_before=$(awk '{print $14 + $15}' "/proc/$2/stat")
    up_before=$(awk '{print $14 + $15}' "/proc/$up_pid/stat")
    threads "$2" >"$work/kernel-$3.threads-before"
    # Core 1's busy time (all but idle and iowait): the load generator, the upstream and
    # the kernel's work for them.
    core1_before=$(awk '$1 == "cpu1" {print $2 + $3 + $4 + $7 + $8}' /proc/stat)
    perf record -F 999 -p "$2" -o "$work/kernel-$3.data" -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
    if [[ -n ${4:-} ]]; then
      load_open_loop "$1" "$4"
      taskset -c 1 "${load[@]}" >"$work/kernel-$3.json"
      python3 -c 'import json, sys; print(sum(json.load(open(sys.argv[1])).get("statusCodeDistribution", {}).values()))' \
        "$work/kernel-$3.json" >"$work/kernel-$3.requests"
    else
      rm -f "$work/kernel-$3.json"
      out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Host: bench.test' "http://127.0.0.1:$1/")
      awk '/ requests in/ {print $1}' <<<"$out" >"$work/kernel-$3.requests"
    fi
    wait "$perf_pid" || true
    threads "$2" >"$work/kernel-$3.threads-after"
    awk -v b="$ticks_before" -v hz="$(getconf CLK_TCK)" '{printf "%.3f\n", ($14 + $15 - b) / hz}' "/proc/$2/stat" >"$work/kernel-$3.cpu"
    awk -v b="$up_before" -v hz="$(getconf CLK_TCK)" '{printf "%.3f\n", ($14 + $15 - b) / hz}' "/proc/$up_pid/stat" >"$work/kernel-$3.upstream"
    awk -v b="$core1_before" -v hz="$(getconf CLK_TCK)" '$1 == "cpu1" {printf "%.3f\n", ($2 + $3 + $4 + $7 + $8 - b) / hz}' /proc/stat >"$work/kernel-$3.core1"
    perf report -i "$work/kernel-$3.data" --stdio --sort sym --percent-limit 0 2>/dev/null >"$work/kernel-$3.report"
  }
  # kernel_table WHAT: the two proxies' figures side by side.
  kernel_table() {
    echo
    echo "### Where each proxy's CPU goes per request, $1 (perf record -F 999, ${DURATION} s, one worker each; ns per request)"
    echo
    python3 - "$work" "$nginx_version" "$(getconf CLK_TCK)" <<'PY'
import re, sys
work, nginx_version, hz = sys.argv[1], sys.argv[2], int(sys.argv[3])
def threads(name, requests):
    def read(when):
        out = {}
        for line in open(f"{work}/kernel-{name}.threads-{when}"):
            ticks, vol, invol, thread = line.split(maxsplit=3)
            t = out.setdefault(thread.strip(), [0, 0, 0])
            t[0] += int(ticks); t[1] += int(vol); t[2] += int(invol)
        return out
    before, after = read("before"), read("after")
    return {
        thread: [(a[i] - before.get(thread, [0, 0, 0])[i]) / requests for i in range(3)]
        for thread, a in after.items()
    }
def load(name):
    requests = int(open(f"{work}/kernel-{name}.requests").read())
    if requests <= 0:
        sys.exit(f"kernel: no requests answered by {name}")
    cpu = float(open(f"{work}/kernel-{name}.cpu").read())
    shares = {}
    for line in open(f"{work}/kernel-{name}.report"):
        m = re.match(r"\s*([\d.]+)%\s+\[([k.])\]\s+(\S+)", line)
        if m:
            key = (m.group(2), m.group(3))
            shares[key] = shares.get(key, 0) + float(m.group(1)) / 100
    per = cpu / requests * 1e9
    sides = {
        side: float(open(f"{work}/kernel-{name}.{side}").read()) / requests * 1e9
        for side in ("upstream", "core1")
    }
    return {k: v * per for k, v in shares.items()}, per, sides, threads(name, requests), requests
hf, hf_total, hf_sides, hf_threads, hf_n = load("holdfast")
ng, ng_total, ng_sides, ng_threads, ng_n = load("nginx")
print(f"| where | holdfast-proxy | nginx {nginx_version} |")
print("| --- | --- | --- |")
print(f"| requests answered | {hf_n} | {ng_n} |")
def latency(name, p):
    try:
        import json
        v = json.load(open(f"{work}/kernel-{name}.json"))["latencyPercentiles"][p]
    except FileNotFoundError:
        return None
    return "—" if v is None else f"{v * 1000:.2f} ms"
for p in ("p50", "p99"):
    hf_l, ng_l = latency("holdfast", p), latency("nginx", p)
    if hf_l is not None:
        print(f"| latency {p} (open loop, perf attached) | {hf_l} | {ng_l} |")
print(f"| the upstream (holdfast-echo, core 1) | {hf_sides['upstream']:.0f} | {ng_sides['upstream']:.0f} |")
print(f"| core 1 busy (the load generator, the upstream, their kernel work) | {hf_sides['core1']:.0f} | {ng_sides['core1']:.0f} |")
print(f"| the proxy, all (CPU time / requests) | {hf_total:.0f} | {ng_total:.0f} |")
for side, label in (("k", "kernel"), (".", "user space")):
    print(f"| {label} | {sum(v for (s, _), v in hf.items() if s == side):.0f} | {sum(v for (s, _), v in ng.items() if s == side):.0f} |")
for label, i in (("voluntary context switches per request", 1), ("involuntary context switches per request", 2)):
    print(f"| {label} | {sum(t[i] for t in hf_threads.values()):.2f} | {sum(t[i] for t in ng_threads.values()):.2f} |")
for name, ts in (("holdfast-proxy", hf_threads), ("nginx", ng_threads)):
    for thread, t in sorted(ts.items(), key=lambda kv: -kv[1][0]):
        if t[0] or t[1]:
            print(f"| {name} thread `{thread}`: CPU ns, switches per request | {t[0] / hz * 1e9:.0f} ns, {t[1] + t[2]:.2f} | |")
kernel = {sym for (s, sym) in list(hf) + list(ng) if s == "k"}
top = sorted(kernel, key=lambda sym: -max(hf.get(("k", sym), 0), ng.get(("k", sym), 0)))[:15]
for sym in top:
    print(f"| kernel: `{sym}` | {hf.get(('k', sym), 0):.0f} | {ng.get(('k', sym), 0):.0f} |")
user = {sym for (s, sym) in list(hf) + list(ng) if s == "."}
top = sorted(user, key=lambda sym: -max(hf.get((".", sym), 0), ng.get((".", sym), 0)))[:12]
for sym in top:
    print(f"| user: `{sym[:60]}` | {hf.get(('.', sym), 0):.0f} | {ng.get(('.', sym), 0):.0f} |")
PY
  }
  if [[ -n $KERNEL ]]; then
    kernel_run "$HF" "$hf_pid" holdfast
    kernel_run "$NG" "$ng_pid" nginx
    kernel_table "wrk -c$CONNS at the maximum"
  fi
  if [[ -n $KRATES ]]; then
    IFS=, read -ra krates <<<"$KRATES"
    for rate in "${krates[@]}"; do
      kernel_run "$HF" "$hf_pid" holdfast "$rate"
      kernel_run "$NG" "$ng_pid" nginx "$rate"
      kernel_table "$LOAD open loop at $rate rps"
    done
  fi
fi

# Two workers each on both cores: holdfast-proxy --worker-threads 2 and nginx
# worker_processes 2, the load generator (two threads) and the upstream on the same two
# cores, so this compares the proxies sharing a whole machine with their load.
start_two_workers() {
  [[ -z ${hf2_pid:-} ]] || return 0
  HF2=$(free_port); HF2A=$(free_port); NG2=$(free_port); HP2=$(free_port)
  RUST_LOG=error taskset -c 0,1 "$BIN/holdfast-proxy" --access-log off --listen "127.0.0.1:$HF2" \
    --admin-listen "127.0.0.1:$HF2A" --debug-listen 127.0.0.1:0 --insecure-plaintext \
    --control-plane "http://127.0.0.1:$CP" --state-dir "$work/state2" --node-id bench2 --worker-threads 2 & pids+=($!)
  hf2_pid=$!
  sed -e "s/^worker_processes 1;/worker_processes 2;/" -e "s/^master_process off;/master_process on;/" \
    -e "s|listen 127.0.0.1:$NG;|listen 127.0.0.1:$NG2;|" -e "/listen 127.0.0.1:$NGS ssl;/d" \
    -e "s|$work/nginx.pid|$work/nginx2.pid|" "$work/nginx.conf" >"$work/nginx2.conf"
  taskset -c 0,1 nginx -c "$work/nginx2.conf" -e "$work/nginx2-error.log" & pids+=($!)
  ng2_pid=$!
  haproxy_conf 2 "$HP2" >"$work/haproxy2.cfg"
  taskset -c 0,1 haproxy -db -f "$work/haproxy2.cfg" & pids+=($!)
  hp2_pid=$!
  wait_port "$HF2"; wait_port "$NG2"; wait_port "$HP2"
  for _ in $(seq 1 100); do curl -sf -H 'Host: bench.test' "http://127.0.0.1:$HF2/" >/dev/null && break; sleep 0.1; done
}
# nginx's CPU is its master's and workers' together.
group_ticks() { local t=0 p; for p in "$1" $(pgrep -P "$1" || true); do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
wrk2_run() {
  local port=$1 pid=$2 t0 c0 t1 c1 out
  taskset -c 0,1 wrk -t2 -c"$CONNS" -d1s -H 'Host: bench.test' "http://127.0.0.1:$port/" >/dev/null
  t0=$(date +%s.%N); c0=$(group_ticks "$pid")
  out=$(taskset -c 0,1 wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -H 'Host: bench.test' "http://127.0.0.1:$port/")
  t1=$(date +%s.%N); c1=$(group_ticks "$pid")
  python3 - "$out" "$c0" "$c1" "$t0" "$t1" "$TICKS" <<'PY'
import re, sys
text, c0, c1, t0, t1, ticks = sys.argv[1], *map(float, sys.argv[2:])
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
pct = lambda p: (m.group(1) if (m := re.search(rf"^\s+{p}%\s+(\S+)", text, re.M)) else "—")
cpu = (c1 - c0) / ticks / (t1 - t0)
errs = "; ".join(l.strip() for l in text.splitlines() if "Non-2xx" in l or "Socket errors" in l) or "0"
print(f"{rps:.0f}|{pct(50)}|{pct(99)}|{errs}|{cpu * 100:.0f}%|{cpu / rps * 1e6:.1f} µs")
PY
}
# wrk2_round PORT PID: one closed-loop run as wrk2_run makes it, and where the whole
# machine's CPU went per request meanwhile: "rps|proxy µs|upstream µs|the rest µs|idle %"
# (the rest: wrk's two threads and the kernel's work outside the two processes).
wrk2_round() {
  local port=$1 pid=$2 t0 c0 u0 s0 t1 c1 u1 s1 out
  taskset -c 0,1 wrk -t2 -c"$CONNS" -d1s -H 'Host: bench.test' "http://127.0.0.1:$port/" >/dev/null
  t0=$(date +%s.%N); c0=$(group_ticks "$pid"); u0=$(cpu_ticks "$up_pid")
  s0=$(awk '$1 == "cpu0" || $1 == "cpu1" {b += $2 + $3 + $4 + $7 + $8; i += $5 + $6} END {print b, i}' /proc/stat)
  out=$(taskset -c 0,1 wrk -t2 -c"$CONNS" -d"${DURATION}s" -H 'Host: bench.test' "http://127.0.0.1:$port/")
  t1=$(date +%s.%N); c1=$(group_ticks "$pid"); u1=$(cpu_ticks "$up_pid")
  s1=$(awk '$1 == "cpu0" || $1 == "cpu1" {b += $2 + $3 + $4 + $7 + $8; i += $5 + $6} END {print b, i}' /proc/stat)
  python3 - "$out" "$c0" "$c1" "$u0" "$u1" "$s0" "$s1" "$TICKS" <<'PY'
import re, sys
text = sys.argv[1]
c0, c1, u0, u1 = map(float, sys.argv[2:6])
(b0, i0), (b1, i1) = (map(float, sys.argv[k].split()) for k in (6, 7))
ticks = float(sys.argv[8])
requests = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
us = lambda t: t / ticks / requests * 1e6
proxy, upstream = us(c1 - c0), us(u1 - u0)
print(f"{rps:.0f}|{proxy:.1f}|{upstream:.1f}|{us(b1 - b0) - proxy - upstream:.1f}|{(i1 - i0) / (b1 - b0 + i1 - i0) * 100:.0f}")
PY
}
# two_core_rounds N: the two-worker runs N times, the three proxies in a rotating order
# each round; each round's figures, then the medians.
two_core_rounds() {
  start_two_workers
  local names=(holdfast nginx haproxy) round k i
  local ports=("$HF2" "$NG2" "$HP2") procs=("$hf2_pid" "$ng2_pid" "$hp2_pid")
  : >"$work/two-core"
  for ((round = 0; round < $1; round++)); do
    for k in 0 1 2; do
      i=$(((round + k) % 3))
      echo "$round ${names[i]} $(wrk2_round "${ports[i]}" "${procs[i]}")" >>"$work/two-core"
    done
  done
  echo
  echo "### Two workers each on both cores, $1 rounds (wrk -t2 -c$CONNS, ${DURATION} s per run, the three proxies in a rotating order; CPU in µs per request)"
  echo
  python3 - "$work/two-core" "$nginx_version" "$haproxy_version" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    round_, name, fields = line.split(" ", 2)
    runs.setdefault(name, {})[int(round_)] = [float(v) for v in fields.strip().split("|")]
label = {"holdfast": "holdfast-proxy `--worker-threads 2`", "nginx": f"nginx {sys.argv[2]} `worker_processes 2`",
         "haproxy": f"HAProxy {sys.argv[3]} `nbthread 2`"}
rounds = sorted(runs["holdfast"])
print("| round | proxy | rps | proxy CPU | upstream CPU | the rest (wrk, kernel) | idle | holdfast/nginx rps | holdfast/HAProxy rps |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rounds:
    for n in label:
        rps, proxy, up, rest, idle = runs[n][r]
        ratios = (f"{rps / runs['nginx'][r][0]:.2f} | {rps / runs['haproxy'][r][0]:.2f}" if n == "holdfast" else " | ")
        print(f"| {r + 1} | {label[n]} | {rps:.0f} | {proxy:.1f} | {up:.1f} | {rest:.1f} | {idle:.0f}% | {ratios} |")
for n in label:
    med = [statistics.median(runs[n][r][k] for r in rounds) for k in range(5)]
    ratios = [runs["holdfast"][r][0] / runs[m][r][0] for r in rounds for m in ("nginx", "haproxy")]
    cell = (f"{statistics.median(ratios[0::2]):.2f} | {statistics.median(ratios[1::2]):.2f}" if n == "holdfast" else " | ")
    print(f"| median | {label[n]} | {med[0]:.0f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} | {med[4]:.0f}% | {cell} |")
PY
}
if [[ -n $TWO_ROUNDS ]]; then
  two_core_rounds "$TWO_ROUNDS"
fi

if [[ -n $PROFILE_ONLY ]]; then
  exit 0
fi

# Warm all three over TLS.
for port in "$HFS" "$NGS" "$HPS"; do
  taskset -c 1 wrk -t1 -c"$CONNS" -d1s -H 'Host: bench.test' "https://127.0.0.1:$port/" >/dev/null
done
echo
echo "### HTTPS against nginx and HAProxy (same ECDSA P-256 certificate, TLS 1.3, ${DURATION} s per run)"
echo
echo "| load | proxy | achieved rps | p50 | p99 | p99.9 | errors | proxy CPU | proxy peak RSS | holdfast/nginx rps | holdfast/HAProxy rps |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
hf=$(wrk_run holdfast-tls "$HFS" "$hf_pid" https); ng=$(wrk_run nginx-tls "$NGS" "$ng_pid" https)
hp=$(wrk_run haproxy-tls "$HPS" "$hp_pid" https)
echo "| wrk keep-alive over TLS (max) | holdfast-proxy | ${hf//|/ | } | $(ratio "$hf" "$ng") | $(ratio "$hf" "$hp") |"
echo "| wrk keep-alive over TLS (max) | nginx $nginx_version | ${ng//|/ | } | | |"
echo "| wrk keep-alive over TLS (max) | HAProxy $haproxy_version | ${hp//|/ | } | | |"
echo
echo "| handshakes | proxy | handshakes/s | proxy CPU | proxy CPU per handshake | proxy peak RSS | resumed | holdfast/nginx handshakes/s | nginx/holdfast CPU per handshake |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for mode in "-new" "-new -tls1_2" "-reuse -tls1_2"; do
  case $mode in
    "-new") what="full, TLS 1.3 (resumption off)" ;;
    "-new -tls1_2") what="full, TLS 1.2 (resumption off)" ;;
    *) what="resumed, TLS 1.2 (resumption on)" ;;
  esac
  # shellcheck disable=SC2086 # the mode is several flags
  hf=$(stime_run holdfast "$HFS" "$hf_pid" $mode)
  # shellcheck disable=SC2086 # the mode is several flags
  ng=$(stime_run nginx "$NGS" "$ng_pid" $mode)
  # shellcheck disable=SC2086 # the mode is several flags
  hp=$(stime_run haproxy "$HPS" "$hp_pid" $mode)
  per() { local f; IFS='|' read -ra f <<<"$1"; echo "${f[2]% µs}"; }
  cpu_ratio=$(python3 -c "a, b = float('$(per "$hf")'), float('$(per "$ng")'); print(f'{b / a:.2f}' if a else '—')")
  echo "| $what | holdfast-proxy | ${hf//|/ | } | $(ratio "$hf" "$ng") | $cpu_ratio |"
  echo "| $what | nginx $nginx_version | ${ng//|/ | } | | |"
  echo "| $what | HAProxy $haproxy_version | ${hp//|/ | } | | |"
done
echo
echo "$(openssl version | cut -d' ' -f1-2) s_time, one client connection at a time on the other core."

start_two_workers
echo
echo "### Two workers each, on both cores (${DURATION} s per run, $CONNS connections, wrk -t2 on the same cores)"
echo
echo "| load | proxy | achieved rps | p50 | p99 | errors | proxy CPU | proxy CPU per request | holdfast/nginx rps | holdfast/HAProxy rps |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
hf=$(wrk2_run "$HF2" "$hf2_pid"); ng=$(wrk2_run "$NG2" "$ng2_pid"); hp=$(wrk2_run "$HP2" "$hp2_pid")
echo "| wrk closed loop (max) | holdfast-proxy \`--worker-threads 2\` | ${hf//|/ | } | $(ratio "$hf" "$ng") | $(ratio "$hf" "$hp") |"
echo "| wrk closed loop (max) | nginx $nginx_version \`worker_processes 2\` | ${ng//|/ | } | | |"
echo "| wrk closed loop (max) | HAProxy $haproxy_version \`nbthread 2\` | ${hp//|/ | } | | |"

# Memory with a large table: a stand-in control plane serving 10,000 more hosts (each a
# backend of its own), a proxy that has applied it, RSS after a short wrk run.
CP3=$(free_port); HF3=$(free_port); HF3A=$(free_port)
"$BIN/holdfast-fake-cp" --listen "127.0.0.1:$CP3" --host bench.test --upstream "127.0.0.1:$UP" \
  --extra-hosts 10000 2>/dev/null & pids+=($!)
wait_port "$CP3"
RUST_LOG=error taskset -c 0 "$BIN/holdfast-proxy" --access-log off --listen "127.0.0.1:$HF3" \
  --admin-listen "127.0.0.1:$HF3A" --debug-listen 127.0.0.1:0 --insecure-plaintext \
  --control-plane "http://127.0.0.1:$CP3" --state-dir "$work/state3" --node-id bench3 --worker-threads 1 & pids+=($!)
hf3_pid=$!
wait_port "$HF3"
for _ in $(seq 1 300); do curl -sf -H 'Host: h9999.extra.test' "http://127.0.0.1:$HF3/" >/dev/null && break; sleep 0.1; done
curl -sf -H 'Host: h9999.extra.test' "http://127.0.0.1:$HF3/" >/dev/null || { echo "the 10,000-host table never served" >&2; exit 1; }
taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Host: h5000.extra.test' "http://127.0.0.1:$HF3/" >/dev/null
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
echo
echo "### Proxy memory with 10,001 routes loaded (10,001 hosts and backends, after a ${DURATION} s wrk run)"
echo
echo "| proxy | RSS | peak RSS (VmHWM) |"
echo "| --- | --- | --- |"
echo "| holdfast-proxy \`--worker-threads 1\` | $(rss_mib "$hf3_pid") MiB | $(hwm_mib "$hf3_pid") MiB |"

if [[ -n $FLAME ]]; then
  command -v perf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >&2; }
  command -v inferno-flamegraph >/dev/null || cargo install --locked --quiet inferno >&2
  perf record -F 499 --call-graph dwarf,16384 -p "$hf_pid" -o "$work/perf.data" -- sleep "$DURATION" >/dev/null 2>&1 &
  perf_pid=$!
  taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Host: bench.test' "http://127.0.0.1:$HF/" >/dev/null
  wait "$perf_pid" || true
  perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"$work/folded"
  inferno-flamegraph --minwidth 0.2 --title "holdfast-proxy under wrk -c$CONNS (one worker, pinned)" <"$work/folded" >"$FLAME"
  cp "$work/folded" "${FLAME%.svg}.folded"
  echo
  echo "Flame graph of holdfast-proxy under wrk: $FLAME (stacks: ${FLAME%.svg}.folded)"
fi
