package compiler

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// checkAccumulate checks the train block's accumulate against the batch
// (the update's samples, batch×accumulate, stay within MaxBatch) and the
// model: the accumulated step runs as a micro-batch loop over the whole
// step, and a batch-coupled layer (batch norm) would then normalise each
// micro-batch by its own statistics — another model than the batch's —, so
// it is refused at the setting, naming the layer. batchSource names where
// an overriding batch came from ("--batch"), "" for the train block.
func checkAccumulate(g *ir.Graph, train TrainConfig, batchSource string) *dsl.Diagnostic {
	if train.Accumulate <= 1 {
		return nil
	}
	pos := train.Pos["accumulate"]
	span := len(fmt.Sprint(train.Accumulate)) // the position is the value's
	if train.StepBatch() > MaxBatch {
		d := dsl.Errorf(pos, "accumulate = %d with batch %d makes updates of %s samples; cnnc compiles steps of at most %s (2^20)",
			train.Accumulate, train.Batch, Commas(train.StepBatch()), Commas(MaxBatch)).Span(span)
		if batchSource != "" {
			d.Hint("the batch comes from %s", batchSource)
		}
		return d.Hint("at batch %d, accumulate is at most %d", train.Batch, MaxBatch/train.Batch)
	}
	for _, n := range g.Nodes {
		if n.Op.Info().BatchCoupled {
			return dsl.Errorf(pos, "accumulate = %d cannot train %s: its batch norm %s (%s) normalises over the whole batch, and accumulated micro-batches would each use their own statistics",
				train.Accumulate, g.Name, n.Name, n.Pos).Span(span).
				Hint("raise the batch instead (a memory_budget then micro-batches only the layers before the batch norm), or remove accumulate")
		}
	}
	return nil
}
