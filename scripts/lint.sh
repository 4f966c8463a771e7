#!/usr/bin/env bash
# Format and lint: no tracked symbolic links, clang-format must leave every C++ source unchanged,
# and clang-tidy (.clang-tidy: bugprone, performance) must find nothing. CUDA sources are formatted but not linted (clang-tidy
# does not parse nvcc's dialect here).
#   scripts/lint.sh            every tracked source (CI). clang-tidy reads the lint preset's
#                              compile database: the cpu preset's flags with each target's sources
#                              in batches of 16 (a unity build, configured only, never compiled),
#                              so Eigen, GoogleTest and HDF5 are parsed once per batch: about 3
#                              min on 2 cores, against 11 file by file. Diagnostics in the batched
#                              .cpp files are kept by the header filter below.
#   scripts/lint.sh FILES...   only these, file by file, over build/cpu's database (scripts/build.sh
#                              cpu first).
set -euo pipefail
cd "$(dirname "$0")/.."
# Where a diagnostic counts: the project's headers and, in a batch, the sources it includes.
filter="--header-filter=^$PWD/(common|kernels|model|datasets|io|analysis|experiments|tests|bench|examples|fuzz)/.*\.(h|cpp)\$"
tidy_args=(--quiet --extra-arg=-Wno-unknown-warning-option)
# Tracked symbolic links: a clone elsewhere would point into this machine (one to an absolute
# path once slipped into a commit).
links=$(git ls-files -s | awk '$1 == "120000" {print $4}')
if [ -n "$links" ]; then echo "tracked symbolic links: $links" >&2; exit 1; fi
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh'); fi
clang-format --dry-run --Werror "${files[@]}"
if [ $# -gt 0 ]; then
  db=build/cpu
  units=()
  for f in "${files[@]}"; do
    case $f in *.cpp) grep -q "\"file\": \"$PWD/$f\"" $db/compile_commands.json && units+=("$f") ;; esac
  done
else
  db=build/lint
  cmake --preset lint > /dev/null
  # A batch is a .cxx that includes .cpp files: by design here, so that check is off.
  tidy_args+=(--checks=-bugprone-suspicious-include "$filter")
  mapfile -t units < <(sed -n 's/^ *"file": "\(.*\)",\?$/\1/p' $db/compile_commands.json)
fi
mkdir -p build/cpu
printf '%s\n' "${units[@]}" | xargs -r -P "$(nproc)" -n 1 clang-tidy -p $db "${tidy_args[@]}" 2>&1 |
  { grep -v "generated\.$" || true; } > build/cpu/lint.log || true
cat build/cpu/lint.log
! grep -qE "(warning|error):" build/cpu/lint.log
