#!/usr/bin/env bash
# The benchmarks' bad command lines (bench/int_options.h): each exits 2 with one line naming
# the option and its value, before any GPU work (so this runs where there is no GPU), and writes
# nothing. Usage: tests/bench_bad_options.sh BENCHMARK_BINARY [SECOND_OPTION (default --d-model)]
set -u
bin=$(realpath "$1")
opt=${2:---d-model}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
expect() {  # expect TEXT_THE_LINE_MUST_HOLD ARGS...
  local want=$1 out rc
  shift
  out=$(cd "$work" && "$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" != 2 ] || [ "$(printf '%s\n' "$out" | wc -l)" != 1 ] ||
     ! grep -qF -- "$want" <<< "$out" || [ -n "$(ls -A "$work")" ]; then
    echo "FAIL: $(basename "$bin") $*: exit $rc, wrote [$(ls -A "$work")], said: $out"
    fail=1
  fi
}
expect "--reps 0: expected a positive integer" --reps 0
expect "--reps 12x: expected a positive integer" --reps 12x
expect "$opt -5: expected a positive integer" "$opt" -5
expect "$opt 99999999999: expected a positive integer" "$opt" 99999999999
expect "$opt: missing value" --reps 8 "$opt"
expect "unknown option '--bogus'" --bogus 3
[ $fail = 0 ] && echo "$(basename "$bin"): every bad command line refused"
exit $fail
