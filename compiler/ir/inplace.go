package ir

// In-place kernels. A node's output 0 may be written over the buffer of
// one of its inputs when the kernel reads element i of that input only to
// compute element i of the output, and reads it before writing it (and the
// two have one type, so one size). Whether it does is the memory planner's
// decision: it also needs the input to die at this kernel. Kernels with an
// in-place rule must honour it for any aliasing the planner picks.
//
// The rules are per op, like the ops table:
//   - the fused grad_input kernels with a maskout epilogue compute
//     dX[i] = (sum over the window of dOut·W) · (xmask[i] > 0): the masked
//     gradient may overwrite the activation it masks;
//   - elementwise ops (relu, relu_grad, dropout, dropout_grad, add) may
//     overwrite their elementwise inputs.
var inPlaceRules = map[Op]func(n *Node) []int{
	OpConvBlockGradInput:   maskOutInput,
	OpLinearBlockGradInput: maskOutInput,
	OpReLU:                 func(*Node) []int { return []int{0} },
	OpReLUGrad:             func(*Node) []int { return []int{0, 1} },
	OpDropout:              func(*Node) []int { return []int{0} },
	OpDropoutGrad:          func(*Node) []int { return []int{0} },
	OpAdd:                  func(*Node) []int { return []int{0, 1} },
}

func maskOutInput(n *Node) []int {
	if !n.Attrs.MaskOut {
		return nil
	}
	// the mask input is the last one in the grad_input layout (fused.go)
	return []int{len(n.Ins) - 1}
}

// InPlaceInputs lists the inputs whose buffer output 0 may take over (see
// the rules above), checking that their types equal the output's.
func (n *Node) InPlaceInputs() []int {
	rule := inPlaceRules[n.Op]
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
