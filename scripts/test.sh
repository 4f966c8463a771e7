#!/usr/bin/env bash
# README command 2: install what is missing, build, run the whole CPU test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh cpu
ctest --preset cpu -j "$(nproc)" --timeout 900
