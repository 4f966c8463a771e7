#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh cpu
mkdir -p runs
build/cpu/divlab train --config configs/tiny.toml --out runs/tiny.h5 --force
