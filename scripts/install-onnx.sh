#!/usr/bin/env bash
# Installs what the ONNX export tests (export/onnx) run the exported models
# with, when missing:
#   - Debian's python3-onnx (1.12) for /usr/bin/python3: onnx.checker;
#   - node and npm (Debian's nodejs, npm) when there is no node;
#   - onnxruntime-node from npm, whose package ships libonnxruntime for
#     linux-x64, into $CNNC_ONNXRUNTIME_DIR (default: the user cache,
#     ~/.cache/cnnc/onnxruntime-node-VERSION), outside the source tree.
#     --ignore-scripts: its install script only fetches GPU binaries, from
#     hosts that need not be reachable.
# cnnc itself never needs any of them. Idempotent and quiet.
set -euo pipefail
ORT_VERSION=1.22.0 # keep equal to ortVersion in export/onnx/runtime_test.go
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
updated=""
apt_install() {
  if [ -z "$updated" ]; then $SUDO apt-get update -qq; updated=1; fi
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if ! /usr/bin/python3 -c "import onnx" 2>/dev/null; then
  apt_install python3-onnx
fi
echo "onnx: $(/usr/bin/python3 -c 'import onnx; print(onnx.__version__)')"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
dir="${CNNC_ONNXRUNTIME_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cnnc/onnxruntime-node-$ORT_VERSION}"
if [ ! -f "$dir/node_modules/onnxruntime-node/package.json" ]; then
  mkdir -p "$dir"
  npm install --prefix "$dir" --ignore-scripts --no-audit --no-fund --no-save --loglevel=error \
    "onnxruntime-node@$ORT_VERSION" >/dev/null
fi
NODE_PATH="$dir/node_modules" node -e 'const o = require("onnxruntime-node"); console.log("onnxruntime-node: " + o.env.versions.node + " (node " + process.version + ")")'
