#!/usr/bin/env bash
# compute-sanitizer over the CUDA backend (run on the GPU machine after building the cuda preset):
#   memcheck, racecheck and initcheck over every reference kernel (the op tests and determinism
#   tests call each of them, and every GPU variant but the racy one): must be clean;
#   racecheck over the racy_scatter candidate: must report its shared-memory hazard (its other
#   race, the read-add-write in global memory, is outside what racecheck can see).
# cuDNN's fused attention kernels (the bf16 attention reference) are Hopper warp-specialised
# kernels: racecheck reports shared-memory hazards in them that their mbarrier/TMA pipelines
# order (racecheck does not model those), and initcheck cannot see their TMA stores, so it flags
# every later read of their outputs (by cuDNN's own rowsum(dO * O) kernel in the backward).
# racecheck skips the generated SDPA kernels, initcheck all cuDNN kernels; what they would
# check is tested directly instead: every output
# element written (CudnnSdpa.WritesEveryOutputElement, NaN-filled buffers), bitwise repeatable
# backward, fp64 agreement. memcheck runs over everything.
# Usage: scripts/sanitize-gpu.sh [build/cuda/tests/divlab_gpu_tests]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/cuda/tests/divlab_gpu_tests}
out=${OUT:-/tmp/divlab-sanitize}
mkdir -p "$out"
clean='GpuOps/*:CudnnSdpa.*:GpuOpsBf16.*:GpuVariants.*:GpuDeterminism.*:GpuEmbedScatter.Controls*:GpuEmbedScatter.Bf16*'
status=0
declare -A skip=([memcheck]="" [racecheck]="--kernel-name-exclude kns=cudnn_generated --kernel-name-exclude kns=nvjet"
                 [initcheck]="--kernel-name-exclude kns=cudnn")
for tool in memcheck racecheck initcheck; do
  # shellcheck disable=SC2086
  if compute-sanitizer --tool "$tool" ${skip[$tool]} --error-exitcode 99 "$bin" --gtest_filter="$clean" \
      > "$out/$tool.log" 2>&1; then
    echo "$tool: clean ($(grep -c '^\[       OK' "$out/$tool.log") tests)"
  else
    echo "$tool: ERRORS (see $tool.log)"; grep -m5 -E "=========  (Invalid|Race|Uninit)" "$out/$tool.log"
    status=1
  fi
done
compute-sanitizer --tool racecheck "$bin" --gtest_filter='GpuEmbedScatter.Racy*' \
  > "$out/racecheck-racy.log" 2>&1
hazards=$(grep -oE "RACECHECK SUMMARY: [0-9]+ hazard" "$out/racecheck-racy.log" | grep -oE "[0-9]+")
if [ "${hazards:-0}" -gt 0 ]; then
  echo "racecheck on racy_scatter: $hazards hazard(s) reported, as documented"
  grep -m3 -E "racy_position_grad" "$out/racecheck-racy.log"
else
  echo "racecheck on racy_scatter: NO hazard reported (expected its shared-memory race)"; status=1
fi
exit $status
