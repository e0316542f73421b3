// Package kernelarg names the kinds of a kernel launch's arguments, the one
// vocabulary of the compiler's launches (codegen.Arg) and the trainer's
// (trainer.Arg, the generated Spec).
//
// In:  nothing. Out: Kind and its constants.
// Why: codegen writes launches and runtime/trainer runs them, and the
// runtime cannot import the compiler: the kinds live below both, in a
// package with no dependencies, so neither mirrors the other.
package kernelarg

import "strconv"

// Kind says what a kernel argument is.
type Kind uint8

const (
	// Buffer is a device pointer to a tensor's buffer (an IR value's, at its
	// offset in an arena).
	Buffer Kind = iota
	// Int is a compile-time integer passed at run time.
	Int
	// Float is a compile-time float passed at run time.
	Float
	// Scalars points to the step's scalar block (CnncStepScalars,
	// runtime/device.StepScalars, trainer.Spec.Scalars): learning rate,
	// step, seed and valid count, which change from step to step. Kernels
	// read them there, so their arguments never change and a captured step
	// replays as it is.
	Scalars
)

// String names the kind as its constant does.
func (k Kind) String() string {
	switch k {
	case Buffer:
		return "Buffer"
	case Int:
		return "Int"
	case Float:
		return "Float"
	case Scalars:
		return "Scalars"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}
