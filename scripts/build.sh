#!/usr/bin/env bash
# Configures and builds one CMake preset (default: cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-cpu}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
