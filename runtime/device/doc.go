// Package device is the one interface generated code runs on: a Device
// allocates one arena, copies bytes in and out, and launches kernels by
// name exactly as cuLaunchKernel takes them, so one launch list drives the
// CPU emulator (runtime/cpu) and the GPU (runtime/cuda) alike. Optional
// interfaces (HostAllocator, AsyncCopier, Fencer, Grapher, Timer) let a backend
// offer more without every backend implementing it (SideStreamer: a second
// stream for NCCL).
//
// The other packages under runtime/ are what generated trainers link:
// data loading, checkpoints, parameter init, the trainer. None of them
// imports gorgonia.org/cu except behind the `cuda` build tag, because that
// package exits at start on machines without a GPU. (This package was
// named runtime; it is device so that no package shadows the standard
// library's runtime.)
package device
