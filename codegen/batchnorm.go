package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Batch norm (templates/batchnorm.cu.tmpl): the statistics (training: one
// block per channel, a deterministic reduction over the valid samples,
// running statistics updated in place; evaluation: read from the running
// ones) and the gradient (one block per channel). The normalisation itself
// is an elementwise kernel bound in its op's file. Both read the batch's
// valid count from the step's scalar block: a padded last batch is
// normalised over its real samples.

const bnThreads = 256 // the templates' reductions assume it

func init() {
	register(ops.BatchNormStats, batchNormRule)
	register(ops.BatchNormGrad, batchNormRule)
}

// bnKernel is what the batch norm templates read.
type bnKernel struct {
	Name, Doc     string
	B, C, S       int64
	Eps, Momentum string
	Affine        bool
}

func batchNormRule(e *emitter, n *ir.Node) error {
	if e.accumulate {
		return fmt.Errorf("codegen: %s: batch norm cannot run in a micro-batch loop", n.Text())
	}
	x := n.Ins[0].Type
	family := "batchnorm_stats"
	if n.Op == ops.BatchNormGrad {
		family, x = "batchnorm_grad", n.Ins[1].Type
		if e.eval {
			return fmt.Errorf("codegen: %s: no gradient in evaluation", n.Text())
		}
	} else if e.eval {
		family = "batchnorm_stats_eval"
	}
	k := &bnKernel{B: e.batch, C: x.Dims[0], S: x.SampleElems() / x.Dims[0], Affine: n.Attrs.Bias}
	k.Eps, k.Momentum = cFloat(n.Attrs.Eps), cFloat(n.Attrs.Momentum)
	switch family {
	case "batchnorm_grad":
		k.Name = fmt.Sprintf("%s_%s_b%d", family, shapeName(x.Dims), e.batch)
		if k.Affine {
			k.Name += "_affine"
		}
		k.Doc = fmt.Sprintf("batch norm gradient over [B,%s] (B = %d, valid at run time)", shapeName(x.Dims), e.batch)
	default:
		k.Name = fmt.Sprintf("%s_%s_b%d_eps%s_m%s", family, shapeName(x.Dims), e.batch, nameNumber(n.Attrs.Eps), nameNumber(n.Attrs.Momentum))
		k.Doc = fmt.Sprintf("batch norm statistics over [B,%s] (B = %d, valid at run time), eps %g, momentum %g", shapeName(x.Dims), e.batch, n.Attrs.Eps, n.Attrs.Momentum)
	}
	if err := e.kernel(family, k.Name, k); err != nil {
		return err
	}
	var args []Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	for _, v := range n.Outs {
		args = append(args, buf(v))
	}
	args = append(args, scalarsArg) // the batch's valid count
	grid, block := [3]uint32{uint32(k.C), 1, 1}, [3]uint32{bnThreads, 1, 1}
	if family == "batchnorm_stats_eval" {
		grid = gridFor(k.C, elementwiseBlock)
		block = [3]uint32{elementwiseBlock, 1, 1}
	}
	e.launch(&Launch{Node: n, Kernel: k.Name, Grid: grid, Block: block, SharedBytes: 0,
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}
