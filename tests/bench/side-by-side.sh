# shellcheck shell=bash
# shellcheck disable=SC2034 # DURATION, CONNS, ROUNDS and BIN are the sourcing script's.
# The start the side-by-side proxy benchmarks share (filters.sh, access-log.sh): their
# flags, the tools, the binaries. Sourced, after `set -euo pipefail` and `cd` to the root:
#
#   . tests/bench/side-by-side.sh NAME DEFAULT_ROUNDS "$@"
#
# Sets DURATION, CONNS, ROUNDS, SMOKE (`--smoke` or empty) and BIN (the binaries'
# directory). --smoke: debug binaries and one short round.
bench_name=$1 ROUNDS=$2
shift 2
DURATION=10 CONNS=50 SMOKE=''
while (($#)); do
  case $1 in
    --smoke) DURATION=1 CONNS=10 ROUNDS=1 SMOKE=--smoke ;;
    --duration) DURATION=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    *) echo "$bench_name: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
tests/bench/tools.sh $SMOKE
if [[ -n $SMOKE ]]; then
  cargo build -q -p holdfast-data-plane -p holdfast-tests --bins
  BIN=$(deploy/local/target-dir.sh)/debug
else
  cargo build --release -q -p holdfast-data-plane -p holdfast-tests --bins
  BIN=$(deploy/local/target-dir.sh)/release
fi
