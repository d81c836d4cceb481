#!/usr/bin/env bash
# Installs what the benchmarks run, when missing: nginx, HAProxy, wrk and taskset from Debian, and
# oha (pinned) from crates.io into ~/.cargo/bin (10-17 minutes the first time: it builds
# SQLite). `--smoke`: not oha; the smoke run sends its open-loop load with holdfast-load.
#   tests/bench/tools.sh [--smoke]
set -euo pipefail
OHA_VERSION=1.16.0
missing=()
for pair in nginx:nginx-light haproxy:haproxy wrk:wrk taskset:util-linux curl:curl python3:python3; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  echo "tests/bench/tools.sh: installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
[[ ${1:-} == --smoke ]] && exit 0
oha=$HOME/.cargo/bin/oha
if ! [[ -x $oha ]] || [[ $("$oha" --version) != "oha $OHA_VERSION" ]]; then
  echo "tests/bench/tools.sh: cargo install oha $OHA_VERSION" >&2
  cargo install --locked --quiet oha --version "$OHA_VERSION" >&2
fi
