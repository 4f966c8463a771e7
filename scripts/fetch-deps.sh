#!/usr/bin/env bash
# Downloads the header-only Debian packages that the GPU machine (no registry access) lacks into
# the git-ignored .deps/, to be carried there with the working tree (run carry: [".deps"]);
# scripts/gpu.sh unpacks them into a private prefix. Today: toml++ (libtomlplusplus-dev).
set -euo pipefail
[ $# -eq 0 ] || { echo "fetch-deps.sh: takes no arguments (got: $*)" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
for p in libtomlplusplus-dev; do
  ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls -l
