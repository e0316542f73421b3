package compiler

import (
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// checkBatchStatistics refuses a batch that gives a batch-statistics node
// (batch norm's, ir.OpInfo.Mutates and BatchCoupled) one value per
// channel: its variance would be 0 and the running variance's unbiased
// estimate undefined — PyTorch refuses it in training too ("Expected more
// than 1 value per channel").
func checkBatchStatistics(g *ir.Graph, batch int64, train TrainConfig, source string) *dsl.Diagnostic {
	for _, n := range g.Nodes {
		info := n.Op.Info()
		if n.Phase != ir.Forward || !info.BatchCoupled || info.Mutates == nil {
			continue
		}
		x := n.Ins[0].Type
		if x.Dims[0] == 0 || batch*(x.SampleElems()/x.Dims[0]) > 1 {
			continue
		}
		d := dsl.Errorf(n.Pos, "%s: batch norm needs more than one value per channel to train, but a batch of %d %s gives one",
			n.Name, batch, x.ShapeString()).Span(len(n.Name))
		switch {
		case source != "":
			d.Hint("the batch comes from %s", source)
		case train.Pos["batch"].IsValid():
			d.Hint("the batch is set at %s", train.Pos["batch"])
		}
		return d.Hint("train with a batch of at least 2 (PyTorch refuses it too)")
	}
	return nil
}
