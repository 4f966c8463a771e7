#!/usr/bin/env bash
# README command 1: install what is missing, build, and show the reported failure: divlab
# reproduce --quick (36 short CPU runs and their analysis; run again, it reuses finished cells).
set -euo pipefail
[ $# -eq 0 ] || { echo "quickstart.sh: takes no arguments (got: $*)" >&2; exit 2; }
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh cpu
build/cpu/divlab reproduce --quick --out runs/reproduce-quick --jobs "$(nproc)"
