#!/usr/bin/env bash
# Installs Debian's PyTorch (python3-torch, CPU) for /usr/bin/python3 when it
# is missing: the checkpoint test loads cnnc's checkpoints into it and the
# CPU benchmarks compare with it. cnnc itself never needs Python.
# Idempotent: does nothing when /usr/bin/python3 imports torch.
set -euo pipefail
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends python3-torch python3-numpy >/dev/null
echo "torch: installed $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
