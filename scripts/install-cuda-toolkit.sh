#!/usr/bin/env bash
# Installs nvcc from Debian's nvidia-cuda-toolkit (CUDA 11.8, non-free) when it is missing.
# Idempotent: does nothing when nvcc is already on PATH.
set -euo pipefail
if command -v nvcc >/dev/null 2>&1; then
  echo "cuda-toolkit: $(nvcc --version | tail -n 2 | head -n 1)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
list=/etc/apt/sources.list.d/cnnc-non-free.sources
if ! grep -rqs 'non-free' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "cuda-toolkit: adding Debian bookworm contrib non-free to $list"
  $SUDO tee "$list" >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit >/dev/null
echo "cuda-toolkit: installed $(nvcc --version | tail -n 2 | head -n 1)"
