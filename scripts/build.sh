#!/usr/bin/env bash
# Configures and builds one CMake preset (default: cpu). Under CI (CI set) a warning fails the
# build (DIVLAB_WERROR, host and device code).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-cpu}
[ $# -le 1 ] || { echo "build.sh: expected at most one preset, got: $*" >&2; exit 2; }
cmake --preset "$preset" ${CI:+-DDIVLAB_WERROR=ON} >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
