//go:build cuda

// Package cuda is the GPU backend of device.Device, on the CUDA driver API
// through gorgonia.org/cu.
//
// In:  the kernels as a fatbin (nvcc -fatbin for sm_80 and sm_90 with PTX,
// see codegen/trainergen.CompileFatbin), then the same calls the CPU
// emulator takes: Alloc, CopyIn, Launch(kernel, grid, block, shared bytes,
// 8-byte params), Sync, CopyOut, Free, Close.
// Out: a device.Device on GPU 0.
//
// Why behind the "cuda" build tag: gorgonia.org/cu's package init calls
// cuInit and exits the process (os.Exit(1)) when there is no GPU or driver,
// so any binary that links it — even a test binary — dies before main on a
// machine without an NVIDIA GPU. Every file of this package carries
// //go:build cuda; `go build ./...`, `go vet ./...` and `go test ./...`
// without tags never link cu (a test in codegen/trainergen guards it). A
// trainer built with -tags cuda therefore starts only where a GPU is.
//
// Threads: a CUDA context is current per OS thread. New starts one
// goroutine locked to its OS thread that creates the context and makes
// every driver call of the device; the methods hand it their work and wait,
// so a Device may be used from any goroutine (calls are serialised).
//
// Streams: one non-blocking stream carries every launch and copy, so work is
// ordered as issued. Copies are synchronous for the caller (they return
// once the bytes have arrived); launches are asynchronous until Sync. A
// kernel fault therefore surfaces at the next Sync or copy, with the name
// of the last kernel launched; with CNNC_CUDA_DEBUG=1 (Options.Debug) every
// launch is followed by a synchronisation and a failure names its kernel.
//
// Memory: Alloc is one cuMemAlloc, checked against cuMemGetInfo first so
// that an arena that cannot fit fails with both numbers (MemoryError). The
// trainer allocates its planned arena exactly once.
//
// Graphs: Capture records a sequence of launches and copies as a CUDA graph
// (stream capture, through a cgo shim) that Replay runs with one call;
// SetParams can update a captured launch's parameter values (see
// graph.go), though the trainer needs none: what changes between steps
// reaches the kernels through the step's scalar block, which the graph
// copies in. Fences (fence.go, device.Fencer) are CUDA events; recorded
// during a capture they become event record nodes of the graph.
//
// Driver versions: the calls whose default version depends on the CUDA
// headers (cuCtxCreate, stream capture, graph instantiation and node
// updates) are resolved at run time through cuGetProcAddress at fixed ABI
// versions (driver.go), so the package makes the same driver calls whether
// compiled with CUDA 11.8 or 12.x headers, and runs on drivers from CUDA
// 11.4 (12.0 when compiled with 12.x headers) to 13.
package cuda
