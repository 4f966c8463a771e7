#!/usr/bin/env bash
# Builds the libFuzzer targets (preset `fuzz`: clang, ASan + UBSan) and runs each for a bounded
# time from a seed corpus: the project's configs for the config parser, real traces (one with
# checkpoints, one with shadow metrics) for the trace reader. A crash, a sanitizer report or an
# exception other than InputError fails the script; reproducers are left in $OUT (default
# build/fuzz/findings). Findings inside libhdf5 itself are counted and reported, not failed on:
# on corrupt files libhdf5 1.10 can loop for minutes (H5HG_read on a damaged global heap) or
# free an invalid pointer (H5G__link_release_table), which no caller can prevent (both found by
# this fuzzer; docs/reliability.md). A crash is ours when an exception escaped (terminate) or
# when its first frame outside the sanitizer, libc and libstdc++ is not in libhdf5.
# Usage: scripts/fuzz.sh [seconds per target, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]] || [ $# -gt 1 ]; then
  echo "fuzz.sh: expected one positive number of seconds per target, got: $*" >&2
  exit 2
fi
out=${OUT:-build/fuzz/findings}
cmake --preset fuzz > /dev/null
cmake --build --preset fuzz -j "$(nproc)" --target fuzz_config fuzz_trace divlab
mkdir -p "$out"
corpus=$(mktemp -d)
mkdir -p "$corpus/config" "$corpus/trace"
cp configs/*.toml "$corpus/config/"
divlab=build/fuzz/divlab
small=(model.vocab=64 model.d_model=16 model.n_layers=1 model.n_heads=2 model.seq_len=8
       train.batch=2 data=zipf:1.2)
ASAN_OPTIONS=detect_leaks=0 "$divlab" train --quiet --set "${small[@]}" train.steps=6 \
  checkpoint.every=2 --out "$corpus/trace/checkpointed.h5" > /dev/null
ASAN_OPTIONS=detect_leaks=0 "$divlab" train --quiet --set "${small[@]}" train.steps=3 \
  checkpoint.every=0 shadow.every=1 'shadow.variants=[embed_rmsnorm_backward=bf16_accum]' \
  --out "$corpus/trace/shadowed.h5" > /dev/null
status=0
# Both targets at once (each fuzzes on one core), then their findings sorted. Stopping this
# script stops them (and -max_total_time bounds them even after a SIGKILL).
trap 'kill $(jobs -p) 2> /dev/null || true' EXIT
for target in fuzz_config fuzz_trace; do
  name=${target#fuzz_}
  ASAN_OPTIONS=detect_leaks=0 build/fuzz/fuzz/$target -fork=1 -ignore_timeouts=1 \
    -ignore_crashes=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$out/$target-" "$corpus/$name" > "$out/$target.log" 2>&1 &
done
wait
for target in fuzz_config fuzz_trace; do
  runs=$(grep -oE '^#[0-9]+' "$out/$target.log" | tail -1 || true)
  ours=0 upstream=0
  for artifact in "$out/$target"-crash-* "$out/$target"-timeout-*; do
    [ -e "$artifact" ] || continue
    trace=$(ASAN_OPTIONS=detect_leaks=0 timeout 60 build/fuzz/fuzz/$target -timeout=10 "$artifact" 2>&1 || true)
    first=$(grep -E '^ +#[0-9]+ ' <<< "$trace" |
            grep -vE '__sanitizer|__asan|__ubsan|__interceptor|fuzzer::|libc\.so|libstdc\+\+|libgcc|_start| in (free|malloc|calloc|realloc|operator (new|delete)[^ ]*) ' |
            head -1 || true)
    if grep -q "terminate called" <<< "$trace" || ! grep -q "libhdf5" <<< "$first"; then
      ours=$((ours + 1)); echo "$target: FINDING in divlab: $artifact"; echo "  $first"
    else
      upstream=$((upstream + 1))
    fi
  done
  echo "$target: ${seconds}s, ${runs#\#} inputs; findings in divlab: $ours; inside libhdf5: $upstream"
  [ $ours -eq 0 ] || status=1
done
rm -rf "$corpus"
exit $status
