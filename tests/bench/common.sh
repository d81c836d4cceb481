# shellcheck shell=bash
# What the proxy benchmarks share; sourced, after `set -euo pipefail`. Sets `work` (a
# scratch directory removed at exit) and `pids` (processes killed at exit).
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The nginx directives that make it send what holdfast-proxy sends upstream: HTTP/1.1
# keep-alive, the Host, the forwarding headers and a loop header of the same size, so the
# upstream and the load generator do the same work behind each proxy. Written to
# $work/forwarding.conf, which nginx configurations `include` in each location.
cat >"$work/forwarding.conf" <<'NGINX'
proxy_http_version 1.1;
proxy_set_header Connection "";
proxy_set_header Host $host;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto $scheme;
proxy_set_header X-Forwarded-Host $host;
proxy_set_header X-Forwarded-Port $server_port;
proxy_set_header X-Real-IP $remote_addr;
proxy_set_header Forwarded "for=$remote_addr;host=$host;proto=$scheme";
proxy_set_header X-Bench-Loop 0123456789abcdef;
NGINX
wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
