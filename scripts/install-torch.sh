#!/usr/bin/env bash
# Installs Debian's PyTorch and torchvision (python3-torch, python3-torchvision,
# CPU) for /usr/bin/python3 when either is missing: the checkpoint test loads
# cnnc's checkpoints into torch, the augmentation test compares with
# torchvision's transforms, and the CPU benchmarks compare with both. cnnc
# itself never needs Python.
# Idempotent: does nothing when /usr/bin/python3 imports torch and torchvision.
set -euo pipefail
versions() { /usr/bin/python3 -c 'import torch, torchvision; print(torch.__version__, "torchvision", torchvision.__version__)'; }
if /usr/bin/python3 -c "import torch, torchvision" 2>/dev/null; then
  echo "torch: $(versions)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends python3-torch python3-torchvision python3-numpy >/dev/null
echo "torch: installed $(versions)"
