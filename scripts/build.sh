#!/usr/bin/env bash
# Configures and builds one CMake preset (default: cpu). Under CI (CI set) a warning fails the
# build (DIVLAB_WERROR, host and device code).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-cpu}
cmake --preset "$preset" ${CI:+-DDIVLAB_WERROR=ON} >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
