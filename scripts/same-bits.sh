#!/usr/bin/env bash
# Whether this tree trains a config to the same bits as another commit of divlab: both built with
# the cpu preset on this machine (fp32 bits depend on the machine's SIMD width, so a stored
# golden value would not travel), both run on the config in fp32, fp64 and bf16, and every
# step's loss and gradient norm compared bit for bit. For a change that must leave a model
# alone (a new model family, a refactor of shared code).
# Usage: scripts/same-bits.sh BASE_REF [CONFIG] [STEPS]   (default configs/tiny.toml, 40 steps)
# Builds BASE_REF in a temporary git worktree (a few minutes on 2 cores); this tree must be
# built already (scripts/build.sh cpu). Exit 0: identical; 1: a difference (printed).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/same-bits.sh BASE_REF [CONFIG] [STEPS]}
config=${2:-configs/tiny.toml}
steps=${3:-40}
here=$PWD/build/cpu/divlab
[ -x "$here" ] || { echo "same-bits: build this tree first (scripts/build.sh cpu)" >&2; exit 2; }
work=$(mktemp -d)
trap 'git worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --quiet --detach "$work/tree" "$base"
(cd "$work/tree" && cmake --preset cpu >/dev/null && cmake --build --preset cpu -j "$(nproc)" \
  --target divlab >/dev/null)
status=0
for precision in fp32 fp64 bf16; do
  for side in base here; do
    bin=$here
    [ $side = base ] && bin=$work/tree/build/cpu/divlab
    "$bin" train --config "$config" --set train.steps="$steps" train.precision=$precision \
      --quiet --out "$work/$side-$precision.h5" >/dev/null
  done
  # Every step's loss and gradient norm as exact hexadecimal floats.
  if ! diff <(h5dump -m %a -d /metrics/loss -d /metrics/grad_norm "$work/base-$precision.h5" |
                grep -v HDF5) \
            <(h5dump -m %a -d /metrics/loss -d /metrics/grad_norm "$work/here-$precision.h5" |
                grep -v HDF5) > "$work/diff-$precision.txt"; then
    echo "same-bits: $precision differs from $base:"; head -20 "$work/diff-$precision.txt"
    status=1
  else
    echo "same-bits: $precision: $steps steps of loss and gradient norm identical to $base"
  fi
done
exit $status
