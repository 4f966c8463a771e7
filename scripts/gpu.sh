#!/usr/bin/env bash
# The GPU machine's one call: build the cuda preset, run the gpu-labelled tests and the
# benchmarks, print a short table last. Usage: scripts/gpu.sh [--all-tests]
# (--all-tests also runs the CPU-labelled suite there: the Ubuntu 24.04 / CMake 4 / CLI11 2.4
# build check.)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/divlab-gpu}
mkdir -p "$out"
declare -A result

step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records pass/fail
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$out/$name.log" 2>&1; then result[$name]="ok ($((SECONDS - t0)) s)"
  else result[$name]="FAILED ($((SECONDS - t0)) s, see $name.log)"; fi
  echo "== $name: ${result[$name]}"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
step configure cmake --preset cuda
step build cmake --build --preset cuda -j "$(nproc)"
if [ "${1:-}" = "--all-tests" ]; then
  step cpu_tests ctest --preset cuda -L cpu -j 8 --timeout 600
fi
step gpu_tests ctest --preset cuda -L gpu --timeout 600 --no-tests=ignore
step bench_cpu build/cuda/bench/bench_cpu_train --config configs/tiny.toml --steps 60

echo
echo "divlab GPU-machine run: $(cat "$out/gpu.txt" | head -1)"
printf '%-12s %s\n' step result
for k in configure build cpu_tests gpu_tests bench_cpu; do
  [ -n "${result[$k]:-}" ] && printf '%-12s %s\n' "$k" "${result[$k]}"
done
grep -E "tests passed|tests failed" "$out"/cpu_tests.log 2>/dev/null | tail -1
tail -7 "$out/bench_cpu.log" 2>/dev/null
