#!/usr/bin/env bash
# Format and lint: clang-format must leave every C++ source unchanged, and clang-tidy (.clang-tidy:
# bugprone, performance) must find nothing, over the CPU build's compile_commands.json (run
# scripts/build.sh cpu first). CUDA sources are formatted but not linted (clang-tidy does not
# parse nvcc's dialect here). Usage: scripts/lint.sh [files...] (default: every tracked source)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh'); fi
clang-format --dry-run --Werror "${files[@]}"
tidy=()
for f in "${files[@]}"; do
  case $f in *.cpp) grep -q "\"file\": \"$PWD/$f\"" build/cpu/compile_commands.json && tidy+=("$f") ;; esac
done
printf '%s\n' "${tidy[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p build/cpu --quiet \
  --extra-arg=-Wno-unknown-warning-option 2>&1 |
  { grep -v "warnings generated" || true; } > build/cpu/lint.log || true
cat build/cpu/lint.log
! grep -qE "(warning|error):" build/cpu/lint.log
