package codegen

// SetForceLongIndex makes the conv and pool kernels generated from now on
// use 64-bit indices (on) and returns the function that restores the
// previous setting.
func SetForceLongIndex(on bool) (restore func()) {
	old := forceLongIndex
	forceLongIndex = on
	return func() { forceLongIndex = old }
}

// ScratchBytesAt is the planner's scratch function at a precision.
var ScratchBytesAt = scratchBytes
