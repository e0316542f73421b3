package trainergen

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// AssembleInfer generates the kernels of an inference compilation
// (res.Graph.Infer: forward blocks, batch norm folded) on p, its memory
// plan (package driver builds it with target's workspace sizes), and the
// Spec of an inference-only build: Eval is the one program, placed by the
// plan (the arena is the inference peak); folded parameters carry their
// Fold, computed from a trainer's checkpoint when it is loaded. Target nil
// is CUDA.
func AssembleInfer(res *compiler.Result, p *plan.Plan, target codegen.Target) (*Compiled, error) {
	g := res.Graph
	if !g.Infer {
		return nil, fmt.Errorf("trainergen: AssembleInfer takes an inference compilation (compiler.Options.Infer)")
	}
	batch := res.Train.Batch
	opts := codegen.Options{Batch: batch, SourceName: res.File.Name, Precision: codegen.Precision(res.Train.Precision), Target: target, Eval: true, SMs: res.Train.SMs, Arch: res.Train.Arch}
	prog, err := codegen.GenerateFromPlan(p, opts)
	if err != nil {
		return nil, err
	}
	place, err := NewPlanLayout(p, prog)
	if err != nil {
		return nil, err
	}
	var ins []span
	if o, ok := p.Offset(g.Inputs[0]); ok {
		ins = append(ins, span{o, g.Inputs[0].Type.Bytes(batch)})
	}
	scalars, grown := scalarsPlace(p, ins)
	progs := Programs{Result: res, Train: prog, TrainPlace: place, Scalars: scalars, ArenaBytes: grown}
	spec, err := specHeader(progs)
	if err != nil {
		return nil, err
	}
	spec.Infer = true
	sb := &specBuilder{p: progs, evalArena: trainer.TrainArena}
	if err := sb.addPersistent(spec); err != nil {
		return nil, err
	}
	for i, par := range g.Params {
		if f := par.Fold; f != nil {
			spec.Params[i].Fold = trainerFold(f)
		}
	}
	spec.CheckpointBytes = checkpointBytes(g, res.Train.Optimizer.StateNames())
	if spec.Eval.Images, err = sb.tensor(prog, g.Inputs[0], "images", false); err != nil {
		return nil, err
	}
	if spec.Eval.Logits, err = sb.tensor(prog, g.Logits, "logits", false); err != nil {
		return nil, err
	}
	if spec.Eval.Launches, err = stepLaunches(prog, false, sb.launchPlace, sb.place); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	spec.PlanSummary = "inference " + planSummary(p)
	return &Compiled{Spec: spec, Plan: p, Eval: prog, Kernels: prog.Source}, nil
}

// checkpointBytes bounds the tensors of a checkpoint of the model as
// trained, which an inference build loads: its parameters (a folded pair
// stands for the conv's weight and bias and the batch norm's weight and
// bias, each at most the folded tensor's size), each with its optimizer
// states, and its buffers (a fold's running statistics and batch count).
func checkpointBytes(g *ir.Graph, states []string) int64 {
	var params, buffers int64
	for _, p := range g.Params {
		b := p.Value.Type.Bytes(1)
		if p.Fold != nil && p.Fold.Bias {
			params += 3 * b    // conv bias, weight and bias of the batch norm
			buffers += 2*b + 8 // its running statistics and count
			continue
		}
		params += b
	}
	for _, p := range g.Buffers {
		buffers += p.Value.Type.Bytes(1)
	}
	return params*int64(1+len(states)) + buffers
}
