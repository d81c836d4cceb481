#!/usr/bin/env bash
# Coverage-guided fuzzing of the data plane's parsers with AFL++ (cargo-afl, stable Rust).
#
#   data-plane/fuzz/afl.sh [--seconds N] [TARGET...]
#
# Targets (default: all): framing, h1, differential, path, snapshot, state_file; their properties are in
# data-plane/fuzz/targets.rs and their seed corpora in data-plane/fuzz/corpus/<target>/.
# Each runs for N seconds (default 10) from its seed corpus. Installs the pinned cargo-afl
# (which builds its AFL++) when missing, builds the instrumented harness into target/afl,
# and fails if any target saved a crash (a panic or a broken property) or a hang (an
# input that ran past 2 s); the inputs are then in target/afl-out/<target>/default/
# (or under $HOLDFAST_AFL_OUT).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD

seconds=10
if [[ ${1:-} == --seconds ]]; then
  seconds=${2:?--seconds needs a value}
  shift 2
fi
targets=("$@")
((${#targets[@]})) || targets=(framing h1 differential path snapshot state_file)

# shellcheck source=../../deploy/local/versions.env
source deploy/local/versions.env
if [[ $(cargo afl --version 2>/dev/null) != "cargo-afl $CARGO_AFL_VERSION "* ]]; then
  echo "afl.sh: cargo install cargo-afl $CARGO_AFL_VERSION (builds AFL++)" >&2
  cargo install --locked --quiet cargo-afl --version "$CARGO_AFL_VERSION"
fi
# cargo-afl builds AFL++ for the running rustc on install; a newer rustc needs a rebuild.
cargo afl config --build >/dev/null 2>&1 || true

export CARGO_TARGET_DIR=$root/target/afl
harness=$root/data-plane/fuzz/afl
cargo afl build --release --locked --quiet --manifest-path "$harness/Cargo.toml"
bin=$CARGO_TARGET_DIR/release/holdfast-fuzz-afl

# No terminal UI; this machine's CPU governor and core_pattern are not ours to change.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
export AFL_NO_AFFINITY=1
failed=0
for target in "${targets[@]}"; do
  out=${HOLDFAST_AFL_OUT:-$root/target/afl-out}/$target
  rm -rf "$out"
  mkdir -p "$out"
  cargo afl fuzz -i "$root/data-plane/fuzz/corpus/$target" -o "$out" -V "$seconds" \
    -t 2000 -- "$bin" "$target" >"$out.log" 2>&1 </dev/null ||
    { echo "afl.sh: $target: afl-fuzz failed (log: $out.log)" >&2; tail -20 "$out.log" >&2; exit 1; }
  stats=$out/default/fuzzer_stats
  value() { awk -v k="$1" '$1 == k { print $3 }' "$stats"; }
  execs=$(value execs_done) crashes=$(value saved_crashes) hangs=$(value saved_hangs)
  echo "afl.sh: $target: $execs inputs in ${seconds} s ($(value execs_per_sec)/s), corpus $(value corpus_count), coverage $(value bitmap_cvg), crashes $crashes, hangs $hangs" >&2
  if ((execs == 0 || crashes > 0 || hangs > 0)); then
    failed=1
    ls "$out"/default/crashes "$out"/default/hangs >&2 || true
  fi
done
exit "$failed"
