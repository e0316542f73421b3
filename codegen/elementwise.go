package codegen

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Elementwise families: one thread per element in a grid-stride loop. An
// op whose binding (compiler/ops, Kernel.Elementwise) names a template
// runs through elementwiseRule with no rule of its own; to_tensor needs
// the image's dimensions.

const elementwiseBlock = 256

func init() {
	register(ir.OpToTensor, toTensor)
}

// toTensor converts the u8 images, augmenting them with the data block's list (augment.go).
func toTensor(e *emitter, n *ir.Node) error {
	u8 := n.Ins[0].Type // [H,W,C]
	aug := newAugData(n.Attrs.Aug, e.eval)
	if aug == nil {
		return elementwise("to_tensor", func(n *ir.Node) map[string]any {
			return map[string]any{"H": u8.Dims[0], "W": u8.Dims[1], "C": u8.Dims[2]}
		})(e, n)
	}
	elems := n.Out().Type.Elems(e.batch)
	name := fmt.Sprintf("to_tensor_%s_b%d%s", shapeName(n.Out().Type.Dims), e.batch, augName(aug))
	params, args := augParams(aug, []string{"const unsigned char* __restrict__ in", "float* __restrict__ out"}, []Arg{buf(n.Ins[0]), buf(n.Out())})
	data := map[string]any{"Name": name, "Elems": elems, "Aug": aug, "Params": strings.Join(params, ", ")}
	if err := e.kernel("to_tensor_aug", name, data); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: name, Grid: gridFor(elems, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}

// elementwiseRule is the rule of an op bound to an elementwise template:
// its constants, as C float literals, go to the template (Consts) and
// into the kernel's name, as do the binding's Data and Suffix.
func elementwiseRule(k ops.Kernel) rule {
	return func(e *emitter, n *ir.Node) error {
		var consts []ops.Const
		if k.Consts != nil {
			consts = k.Consts(&n.Attrs)
		}
		var suffix strings.Builder
		for _, c := range consts {
			fmt.Fprintf(&suffix, "_%s%s", strings.ToLower(c.Name), nameNumber(c.Value))
		}
		if k.Suffix != nil {
			suffix.WriteString("_" + k.Suffix(n))
		}
		return elementwise(k.Elementwise, func(*ir.Node) map[string]any {
			cs := map[string]string{}
			for _, c := range consts {
				cs[c.Name] = cFloat(c.Value)
			}
			data := map[string]any{"Consts": cs}
			if k.Data != nil {
				for name, v := range k.Data(n) {
					data[name] = v
				}
			}
			return data
		}, suffix.String())(e, n)
	}
}

// elementwise makes the rule of a kernel whose arguments are the node's
// inputs then its output, over the output's elements; suffix ends the
// kernel's name.
func elementwise(family string, extra func(n *ir.Node) map[string]any, suffix ...string) rule {
	return func(e *emitter, n *ir.Node) error {
		out := n.Out()
		elems := out.Type.Elems(e.batch)
		name := fmt.Sprintf("%s_%s_b%d%s", family, shapeName(out.Type.Dims), e.batch, strings.Join(suffix, ""))
		data := map[string]any{"Name": name, "Elems": elems}
		if extra != nil {
			for k, v := range extra(n) {
				data[k] = v
			}
		}
		if err := e.kernel(family, name, data); err != nil {
			return err
		}
		var args []Arg
		for _, v := range n.Ins {
			args = append(args, buf(v))
		}
		args = append(args, buf(out))
		e.launch(&Launch{Node: n, Kernel: name, Grid: gridFor(elems, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
			Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
		return nil
	}
}

// zeroFill clears v's buffer (a micro-batch loop's gradient accumulator)
// before node n runs; the launch belongs to n.
func (e *emitter) zeroFill(n *ir.Node, v *ir.Value) error {
	words := (v.Type.Bytes(e.prog.Batch) + 3) / 4
	name := fmt.Sprintf("fill_zero_%d", words)
	if err := e.kernel("fill_zero", name, map[string]any{"Name": name, "Elems": words}); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: name, Grid: gridFor(words, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
		Args: []Arg{buf(v)}, MinBytes: 4 * words})
	return nil
}
