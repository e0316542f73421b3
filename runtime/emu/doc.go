// Package emu runs cnnc's generated CUDA C kernels on the CPU, so that code generation can be
// tested end to end on machines without a GPU.
//
// In: the .cu text cnnc generates (extern "C" __global__ kernels taking device pointers and
// scalars) and launches described exactly as for cuLaunchKernel: kernel name, grid, block,
// dynamic shared bytes, and one 8-byte value per parameter. Out: the kernels' effects on
// emulated device memory (C allocations from Alloc), or an error.
//
// Why shaped so: the kernels under test must be the very text that runs on the GPU, so the
// emulation is a header (cuda_emu.h) that makes CUDA C compile as C++20 with g++, not a
// translation of the source. Compile writes the source into a content-addressed cache, appends
// one trampoline per kernel — extern "C" cnnc_emu_entry_NAME(void** params), which unpacks
// the parameters with the types of the kernel's own signature, deduced by C++ templates, so no
// parameter list is parsed here — builds a shared library and dlopens it. Each library
// carries its own copy of the runtime (scheduler, fibers) from the header, so the Go side
// only moves bytes and starts worker goroutines; the runtime also works without Go
// (cnnc_emu::launch<kernel>(grid, block, shared, args...) in a plain C++ program).
//
// Built-in libraries: a program that must run without a compiler (a trainer, a program using
// a `cnnc gen` package) carries its kernels compiled by go build instead. BuiltinSource turns a
// source into a C++ translation unit for cgo (beside a copy of cuda_emu.h) that ends in a
// lookup function standing in for dlsym; the program registers it at init (RegisterBuiltin)
// and Compile of the same source (matched by SHA-256) loads it without running a compiler or
// touching the cache. Several can share one executable: kernels are renamed by a hash of source
// and header (and weak, so the same library twice merges), the runtime lives in a namespace
// named by the header's hash, and the C API is internal to each translation unit. Tests
// (which register none) and Options.Compiler/Flags/Debug keep compiling at run time as
// described above, so the AddressSanitizer mode below is unchanged.
//
// Execution: blocks are spread over Workers OS threads (goroutines inside cgo calls); a block
// runs wholly on one OS thread, so __shared__ (static thread_local) is private to the block.
// The threads of a block are fibers with their own stacks, switched by a dozen instructions of
// assembly; __syncthreads() and the warp-synchronous intrinsics (shuffles, votes, __syncwarp,
// __reduce_*_sync) yield to the block's scheduler, which runs warp by warp. A thread that
// finishes without blocking starts the next one on the same stack, so barrier-free kernels
// cost a function call per thread. Kernel failures become errors of the launch, not hangs or
// crashes: __trap(), a failed device assert(), threads that exit while others wait at
// __syncthreads(), and lanes that wait for each other in different warp operations.
//
// Kernel-side conventions (cuda_emu.h): dynamic shared memory is declared with
// CNNC_DYNAMIC_SHARED(type, name), whose real-CUDA definition is DynamicSharedCUDA (the header
// itself defines it that way under nvcc/NVRTC); use the *_sync warp intrinsics, since
// implicit warp lock-step is not emulated.
//
// Race mode (Module.SetSchedule): since a block's threads run one after another, a kernel that
// reads what another thread wrote without a barrier in between can be right by luck in the
// default order (warp by warp, lane by lane). Under a schedule, each barrier interval's warps, and
// each warp's lanes at every sweep, run in reverse or in a seeded random order, dynamic and static
// shared memory is filled with 0xFF (NaN) at the start of every block, and wmma fragments get a
// permuted element layout; comparing a launch's output bit for bit with the forward order's
// exposes such races (codegen's TestKernelsAreRaceFree does it for every kernel of the examples).
// The orders also take the grid's blocks in another order (reversed, or a seeded affine
// permutation i -> (a·i + c) mod blocks; a traced launch keeps the default): blocks that meet
// through global memory — a "last block reduces" counter, where which block arrives last depends
// on the order — must give the same bits in every order too (exactly that order with one worker;
// with several, blocks also overlap).
//
// Access traces (Module.Trace, on a module compiled with TraceFlags): every load and store a
// kernel makes to shared or global memory is recorded with its lane and its site (the access
// instruction), through GCC's kernel-AddressSanitizer instrumentation, whose calls the header
// implements as recorders; the optimisations that would change access widths are off. When a
// warp reaches a barrier or exits, the n-th execution of a site by each lane forms one warp
// access, costed as the GPU's memory pipeline would: shared memory in wavefronts (32 banks of 4
// bytes, 8- and 16-byte accesses in phases of 16 and 8 lanes, lanes reading one word share it),
// global memory in 32-byte sectors; wmma tiles as their rows' 16-byte chunks, 8 per phase;
// cp.async as its global read and its shared write. Only a sample of the grid's blocks runs
// (SampleBlocks: edges and spread interior blocks, weighted by the blocks they stand for).
// compiler/perf builds its performance model on these counts. Accesses to static __shared__
// arrays at constant in-bound indices are not seen (the instrumentation skips them); cnnc's
// kernels use dynamic shared memory.
//
// Tensor cores, bfloat16, cp.async: nvcuda::wmma fragments for TF32 m16n16k8 and BF16 m16n16k16
// with fp32 accumulators (fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync,
// __float_to_tf32), __nv_bfloat16 with its conversions, and the cp.async primitives
// (__pipeline_memcpy_async, __pipeline_commit, __pipeline_wait_prior). The roundings are bit-exact:
// TF32 as the code ptxas emits for cvt.rna.tf32.f32, BF16 to nearest even. A fragment holds
// tile/32 elements per lane in the emulator's own layout, so kernels may touch x[] only through
// operations applied alike to every element (the race-mode orders also permute the layout, so a
// kernel that depends on it shows a difference); mma_sync needs all 32 lanes and forms exact
// products, summed with the accumulator in double precision and rounded once to fp32 per call;
// load/store trap on a pointer that is not 256-bit aligned or an ldm that is not a multiple of 16
// bytes. A cp.async copy happens when the thread waits for its group (so reading the destination
// too early sees stale data); misaligned copies, destinations outside shared memory and threads
// that exit with copies in flight fail the launch.
//
// Memory errors: every Alloc is its own C allocation. Under `go test -asan` kernel libraries
// are compiled with AddressSanitizer, which then reports out-of-bounds kernel accesses with the
// .cu file and line (dynamic shared memory is checked too; static __shared__ arrays are not).
//
// Limitations: x86-64 uses the assembly context switch, other targets fall back to ucontext
// (slower). Threads of a block run one at a time, so code that spin-waits for another thread
// or block without a barrier hangs, and warp-synchronous code without *_sync intrinsics (old
// volatile-shared-memory reductions) is wrong. Shuffling from a lane that does not exist or did
// not take part returns the caller's own value (undefined in CUDA). A wild pointer or a fiber
// stack overflow (256 KiB stacks, 1 MiB under ASan, guard page below each) crashes the process
// like any cgo fault. No half type, textures, cooperative groups, __constant__
// memory written from the host, or streams: launches are synchronous. Kernels run with the CPU's
// float arithmetic (no fused multiply-add unless the compiler flags allow it), so compare
// against references with a tolerance, as for a GPU.
//
// Performance (2-core x86-64 VM, g++ 12 -O3, 2 workers; TestPerformance logs it): the 67x67x67
// shared-memory tiled matmul (25 blocks of 16x16 threads, 10 barriers per thread) takes about
// 2 ms (230 ms with swapcontext fibers); saxpy over 1M threads (4096 blocks of 256, no barrier)
// about 7-10 ms (11 ms on one worker). Under -asan: about 7 ms and 25 ms. -O3 rather than -O2:
// generated conv kernels run faster (SimpleCNN's training step 0.99 s -> 0.68 s, `make bench`)
// for about a second more of compiling (2.4 s for SimpleCNN's kernels, once: the cache);
// -march=native added nothing measurable and would tie cached libraries to one CPU. Compiling a
// kernel file takes a second or two the first time and only a dlopen afterwards (cache);
// built-in libraries are compiled with the same flags, once, when the program is built.
package emu
