package codegen

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Gradient clipping (templates/clip.cu.tmpl): clip_grad_norm's global L2
// norm over every gradient, in two kernels with a fixed order of
// additions, and its coefficient, which the updates read from device
// memory (updateRule).

const (
	clipThreads = 256  // the templates' tree reductions assume a power of two
	clipChunk   = 4096 // gradient elements per block of the partial sums
)

func init() {
	register(ops.ClipGradNormOp, clipRule)
	registerScratch(ops.ClipGradNormOp, func(n *ir.Node, _ int64, _ sizing) (int64, error) {
		return ScratchAligned(clipPartialsType(n).Bytes(1)), nil
	})
}

// clipBlocks is the partial sums of n's norm: one per clipChunk elements.
func clipBlocks(n *ir.Node) int64 { return max(divUp(clipTotal(n), clipChunk), 1) }

// clipTotal is the gradient elements clip_grad_norm reads.
func clipTotal(n *ir.Node) int64 {
	var t int64
	for _, v := range n.Ins {
		t += v.Type.SampleElems()
	}
	return t
}

// clipPartialsType holds one double per block (two f32 words each).
func clipPartialsType(n *ir.Node) ir.Type { return ir.F32Fixed(2 * clipBlocks(n)) }

// clipGrad is one gradient of the concatenation the partial sums run over.
type clipGrad struct{ Index, Offset, End int64 }

// clipSizesHash names a list of gradient sizes in kernel names (kernels
// differ with the sizes, not only with their total).
func clipSizesHash(n *ir.Node) string {
	var sizes []string
	for _, v := range n.Ins {
		sizes = append(sizes, fmt.Sprint(v.Type.SampleElems()))
	}
	h := sha256.Sum256([]byte(strings.Join(sizes, ",")))
	return hex.EncodeToString(h[:4])
}

func clipRule(e *emitter, n *ir.Node) error {
	if e.accumulate {
		return fmt.Errorf("codegen: %s: clip_grad_norm reads whole gradients and cannot run in a micro-batch loop", n.Text())
	}
	total, blocks := clipTotal(n), clipBlocks(n)
	partials := e.Scratch(n, "norm_partials", clipPartialsType(n))
	var grads []clipGrad
	var params []string
	var off int64
	for i, v := range n.Ins {
		size := v.Type.SampleElems()
		grads = append(grads, clipGrad{Index: int64(i), Offset: off, End: off + size})
		params = append(params, fmt.Sprintf("const float* __restrict__ g%d", i))
		off += size
	}
	params = append(params, "double* __restrict__ partials")
	name := fmt.Sprintf("clip_norm_partial_n%d_g%d_%s", total, len(n.Ins), clipSizesHash(n))
	if err := e.kernel("clip_norm_partial", name, map[string]any{
		"Name": name, "Params": strings.Join(params, ", "), "Threads": clipThreads, "Chunk": clipChunk, "Total": total, "Grads": grads,
		"Doc": fmt.Sprintf("sums of squares of %d gradient elements (%d gradients), in double, one per block of %d elements.", total, len(n.Ins), clipChunk),
	}); err != nil {
		return err
	}
	var args []Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	args = append(args, buf(partials))
	e.launch(&Launch{Node: n, Kernel: name, Grid: [3]uint32{uint32(blocks), 1, 1}, Block: [3]uint32{clipThreads, 1, 1},
		Args: args, FLOPs: 2 * total, MinBytes: 4*total + 8*blocks})
	coefName := fmt.Sprintf("clip_norm_coef_p%d_max%s", blocks, nameNumber(n.Attrs.MaxNorm))
	if err := e.kernel("clip_norm_coef", coefName, map[string]any{
		"Name": coefName, "Threads": clipThreads, "Blocks": blocks, "MaxNorm": cDouble(n.Attrs.MaxNorm),
		"Doc": fmt.Sprintf("adds %d partial sums in order; the clipping coefficient min(1, %g/(norm + 1e-6)).", blocks, n.Attrs.MaxNorm),
	}); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: coefName, Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{clipThreads, 1, 1},
		Args: []Arg{buf(partials), buf(n.Out())}, FLOPs: blocks + 4, MinBytes: 8*blocks + 4})
	return nil
}
