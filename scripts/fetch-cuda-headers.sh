#!/usr/bin/env bash
# Fetches the CUDA driver API headers (cuda.h, cudaTypedefs.h) of the newest CUDA in Debian's
# archive — nvidia-cuda-dev of trixie non-free, CUDA 12.4 — into a cache directory, so that the
# -tags cuda build is checked against them as well as against the installed toolkit (11.8):
# `make test-cuda-headers`. Nothing is installed and the system's CUDA stays as it is: a private
# apt configuration (its own sources list, state and cache, under a temporary directory) runs
# `apt-get update` and `apt-get download`, which check the package against the archive's
# signed index, and only the two headers are unpacked. They lead the package's data archive,
# so tar stops after its first ~3 MB instead of unpacking 2.5 GB of libraries (dpkg -x would);
# the .deb (about 900 MB) is deleted and only the headers (1.2 MB) are kept.
#
# Usage: fetch-cuda-headers.sh [DIR]   prints DIR/include (the -I directory) on stdout.
# DIR defaults to ${XDG_CACHE_HOME:-~/.cache}/cnnc/cuda-headers-SUITE; SUITE is
# $CNNC_CUDA_HEADERS_SUITE (default trixie). A DIR that already has the headers is reused
# without touching the network.
set -euo pipefail
suite=${CNNC_CUDA_HEADERS_SUITE:-trixie}
dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/cnnc/cuda-headers-$suite}
say() { echo "fetch-cuda-headers: $*" >&2; }

if [ -f "$dir/include/cuda.h" ] && [ -f "$dir/include/cudaTypedefs.h" ] && [ -f "$dir/SOURCE" ]; then
  say "cached: $(cat "$dir/SOURCE") in $dir"
  echo "$dir/include"
  exit 0
fi

mkdir -p "$(dirname "$dir")"
work=$(mktemp -d "$(dirname "$dir")/.fetch-cuda-headers.XXXXXX")
trap 'rm -rf "$work"' EXIT
apt="$work/apt"
mkdir -p "$apt/etc/sources.list.d" "$apt/etc/preferences.d" "$apt/state/lists/partial" \
  "$apt/cache/archives/partial" "$work/deb" "$work/new/include"
: >"$apt/state/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { say "$keyring is missing (apt-get install debian-archive-keyring)"; exit 1; }
echo "deb [signed-by=$keyring] http://deb.debian.org/debian $suite non-free" >"$apt/etc/sources.list"
# The system's apt.conf.d still applies (a proxy, say); sources, pins, state and cache are ours.
opts=(-o "Dir::Etc::SourceList=$apt/etc/sources.list" -o "Dir::Etc::SourceParts=$apt/etc/sources.list.d"
  -o "Dir::Etc::Preferences=$apt/etc/preferences" -o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
  -o "Dir::State=$apt/state" -o "Dir::State::status=$apt/state/status" -o "Dir::Cache=$apt/cache"
  -o "APT::Architecture=$(dpkg --print-architecture)" -o "APT::Architectures=$(dpkg --print-architecture)"
  -o "Acquire::Languages=none" -o "APT::Sandbox::User=$(id -un)")

say "apt-get update ($suite non-free, private state in $apt)"
apt-get "${opts[@]}" -qq update
say "apt-get download nvidia-cuda-dev ($suite)"
(cd "$work/deb" && apt-get "${opts[@]}" -qq download nvidia-cuda-dev)
deb=$(ls "$work"/deb/nvidia-cuda-dev_*.deb)
version=$(dpkg-deb -f "$deb" Version)

# tar leaves as soon as it has both headers; dpkg-deb then dies of the closed pipe, so its
# status is not the verdict — the headers are (and its messages are shown only without them).
dpkg-deb --fsys-tarfile "$deb" 2>"$work/dpkg-deb.err" |
  tar -x -C "$work/new" --occurrence=1 ./usr/include/cuda.h ./usr/include/cudaTypedefs.h || true
for h in cuda.h cudaTypedefs.h; do
  [ -s "$work/new/usr/include/$h" ] || { cat "$work/dpkg-deb.err" >&2; say "$h is not in $deb"; exit 1; }
  mv "$work/new/usr/include/$h" "$work/new/include/$h"
done
rm -rf "$work/new/usr"
cuda=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$work/new/include/cuda.h")
[ -n "$cuda" ] || { say "no CUDA_VERSION in cuda.h of $deb"; exit 1; }
echo "nvidia-cuda-dev $version ($suite), CUDA_VERSION $cuda" >"$work/new/SOURCE"

rm -rf "$dir"
mv "$work/new" "$dir"
say "$(cat "$dir/SOURCE") -> $dir"
echo "$dir/include"
