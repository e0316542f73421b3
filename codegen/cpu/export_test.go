package cpu

// OwnWorkspace is the CPU kernels' own scratch for a node (Workspace is the larger of it and
// CUDA's).
var OwnWorkspace = ownWorkspace
