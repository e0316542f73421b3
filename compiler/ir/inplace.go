package ir

// In-place kernels. A node's output 0 may be written over the buffer of
// one of its inputs when the kernel reads element i of that input only to
// compute element i of the output, and reads it before writing it (and the
// two have one type, so one size). Whether it does is the memory planner's
// decision: it also needs the input to die at this kernel. Kernels with an
// in-place rule (OpInfo.InPlace, given by each op's file) must honour it
// for any aliasing the planner picks.

// InPlaceInputs lists the inputs whose buffer output 0 may take over (see
// the op's rule), checking that their types equal the output's.
func (n *Node) InPlaceInputs() []int {
	rule := n.Op.Info().InPlace
	if rule == nil || len(n.Outs) == 0 {
		return nil
	}
	var out []int
	for _, i := range rule(n) {
		if i < len(n.Ins) && n.Ins[i].Type.Equal(n.Outs[0].Type) {
			out = append(out, i)
		}
	}
	return out
}
