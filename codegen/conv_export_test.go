package codegen

import "github.com/cnnc/cnnc/compiler/ir"

// SetForceLongIndex makes the conv and pool kernels generated from now on
// use 64-bit indices (on) and returns the function that restores the
// previous setting.
func SetForceLongIndex(on bool) (restore func()) {
	old := forceLongIndex
	forceLongIndex = on
	return func() { forceLongIndex = old }
}

// SetForceWgradHalo makes the weight gradients generated from now on take
// the staged-region kernel wherever it applies, whatever its partials
// (on), and returns the function that restores the previous setting.
func SetForceWgradHalo(on bool) (restore func()) {
	old := forceWgradHalo
	forceWgradHalo = on
	return func() { forceWgradHalo = old }
}

// ScratchBytesAt is the planner's scratch function at a precision and an
// SM count.
func ScratchBytesAt(n *ir.Node, samples int64, prec Precision, sms int64) int64 {
	return scratchBytes(n, samples, sizing{prec, smsOr(sms)})
}
