#!/usr/bin/env bash
# README command 2: install what is missing, build, run the whole CPU test suite, then fuzz the
# config parser and the trace reader for a bounded time (DIVLAB_FUZZ_SECONDS, default 60 each).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh cpu
ctest --preset cpu -j "$(nproc)" --timeout 900
scripts/fuzz.sh "${DIVLAB_FUZZ_SECONDS:-60}"
