// Package trainergen turns a compiled model into what a generated trainer
// links: a trainer.Spec (arena offsets of every tensor, the launches of a
// training step and of evaluation) and the Go source that declares it.
//
// In:  the compiler's Result and its memory plan (package driver plans it
// with the target's workspace sizes); Assemble generates the codegen
// Programs of the training step and of evaluation from them and lays them
// out (the planner's offsets, or NaiveLayout).
// Out: a *trainer.Spec, and Go files rendered with jennifer; CompileFatbin
// runs nvcc on the CUDA kernels, WriteModule* write a trainer module and
// GoBuild runs go build on it.
package trainergen

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// Layout places IR values in an arena.
type Layout interface {
	// Offset is where v's buffer starts.
	Offset(v *ir.Value) (int64, bool)
	// Bytes is the arena size.
	Bytes() int64
}

// NaiveLayout gives every buffer of a program its own 256-byte aligned
// place: no reuse at all. It is the baseline the memory planner improves
// on, and what evaluation (forward only) uses.
type NaiveLayout struct {
	offsets map[*ir.Value]int64
	sizes   map[*ir.Value]int64
	size    int64
}

// NewNaiveLayout lays out the given values (views resolved by prog) and
// every buffer prog's launches use, at the given batch; skip says which
// values live elsewhere (e.g. parameters in the training arena).
func NewNaiveLayout(prog *codegen.Program, values []*ir.Value, skip func(*ir.Value) bool) *NaiveLayout {
	l := &NaiveLayout{offsets: map[*ir.Value]int64{}, sizes: map[*ir.Value]int64{}}
	add := func(v *ir.Value) {
		v = prog.Buffer(v)
		if _, ok := l.offsets[v]; ok || (skip != nil && skip(v)) {
			return
		}
		l.offsets[v] = l.size
		l.sizes[v] = (v.Type.Bytes(prog.Batch) + 255) / 256 * 256
		l.size += l.sizes[v]
	}
	for _, v := range values {
		add(v)
	}
	for _, ln := range prog.Launches {
		for _, a := range ln.Args {
			if a.Kind == kernelarg.Buffer {
				add(a.Value)
			}
		}
	}
	return l
}

func (l *NaiveLayout) Offset(v *ir.Value) (int64, bool) {
	o, ok := l.offsets[v]
	return o, ok
}

func (l *NaiveLayout) Bytes() int64 { return l.size }

// Programs are the inputs of BuildSpec.
type Programs struct {
	Result     *compiler.Result
	Train      *codegen.Program
	TrainPlace Layout
	Eval       *codegen.Program
	EvalPlace  Layout
	// EvalGraph is the graph Eval was generated from: Result.Graph (nil),
	// or an evaluation compilation's with batch norm folded.
	EvalGraph *ir.Graph
	// EvalInTrainArena: EvalPlace's offsets are in the training arena
	// (evaluation borrows its temporary space) rather than an arena of
	// their own.
	EvalInTrainArena bool
	// Scalars is the offset of the step's scalar block in the training
	// arena (trainer.Spec.Scalars), in bytes no value of TrainPlace or
	// (with EvalInTrainArena) EvalPlace holds; ArenaBytes, when not 0,
	// is the training arena's size with it (it lies past TrainPlace's).
	Scalars    int64
	ArenaBytes int64
}

// BuildSpec assembles the trainer.Spec of a compiled model.
func BuildSpec(p Programs) (*trainer.Spec, error) {
	spec, err := specHeader(p)
	if err != nil {
		return nil, err
	}
	sb := &specBuilder{p: p, evalArena: trainer.EvalArena}
	if p.EvalPlace != nil && !p.EvalInTrainArena {
		spec.EvalArenaBytes = p.EvalPlace.Bytes()
	}
	if p.EvalInTrainArena {
		sb.evalArena = trainer.TrainArena
	}
	if err := sb.addPersistent(spec); err != nil {
		return nil, err
	}
	g := p.Result.Graph
	if spec.Train, err = buildStep(p.Train, g, false, sb.launchPlace, sb.tensor, sb.place); err != nil {
		return nil, err
	}
	if p.Eval != nil {
		eg := g
		if p.EvalGraph != nil {
			eg = p.EvalGraph
		}
		if spec.Eval, err = buildStep(p.Eval, eg, true, sb.launchPlace, sb.tensor, sb.place); err != nil {
			return nil, err
		}
		if spec.EvalFolds, err = sb.evalFolds(p.Eval, eg); err != nil {
			return nil, err
		}
	}
	return spec, spec.Validate()
}

// specHeader is the Spec's model, shapes, training settings and arena
// size, for a fused image classifier.
func specHeader(p Programs) (*trainer.Spec, error) {
	g := p.Result.Graph
	classes := int64(0)
	switch {
	case g.Infer && len(g.Inputs) == 1 && g.Inputs[0].Type.DType == ir.U8 && g.Logits != nil:
		classes = g.Logits.Type.Dims[0]
	case !g.Infer && len(g.Inputs) == 2 && g.Inputs[0].Type.DType == ir.U8 && g.Inputs[1].Type.DType == ir.Class:
		classes = g.Inputs[1].Type.Classes
	default:
		return nil, fmt.Errorf("trainergen: %s is not a fused image classifier (inputs %v)", g.Name, g.Inputs)
	}
	img := g.Inputs[0].Type // [H,W,C]
	spec := &trainer.Spec{
		Model: g.Name, Source: p.Result.File.Name, Batch: int(p.Train.Batch),
		H: int(img.Dims[0]), W: int(img.Dims[1]), C: int(img.Dims[2]),
		Classes: int(classes),
		Epochs:  int(p.Result.Train.Epochs), LR: float32(p.Result.Train.Optimizer.LR), Seed: p.Result.Train.Seed,
		Optimizer:  p.Result.Train.Optimizer.String(),
		Schedule:   p.Result.Train.Schedule,
		ArenaBytes: max(p.TrainPlace.Bytes(), p.ArenaBytes),
		Scalars:    p.Scalars,
	}
	if p.Eval != nil && p.Eval.Batch != p.Train.Batch {
		spec.EvalBatch = int(p.Eval.Batch) // evaluated in chunks
	}
	return spec, nil
}

// specBuilder places the programs' values in the Spec's arenas.
type specBuilder struct {
	p         Programs
	evalArena trainer.Arena // where evaluation's own values live
}

// place is the arena and offset of v's buffer: parameters and optimizer
// state, and all of training's values, in the training arena.
func (b *specBuilder) place(prog *codegen.Program, v *ir.Value, eval bool) (trainer.Arena, int64, error) {
	v = prog.Buffer(v)
	if !eval || trainedValue(v) {
		o, ok := b.p.TrainPlace.Offset(v)
		if !ok {
			return 0, 0, fmt.Errorf("trainergen: %s has no place in the training arena", v)
		}
		return trainer.TrainArena, o, nil
	}
	o, ok := b.p.EvalPlace.Offset(v)
	if !ok {
		return 0, 0, fmt.Errorf("trainergen: %s has no place in the evaluation arena", v)
	}
	return b.evalArena, o, nil
}

// tensor is v as a named Spec tensor, its shape with the program's batch.
func (b *specBuilder) tensor(prog *codegen.Program, v *ir.Value, name string, eval bool) (trainer.Tensor, error) {
	a, o, err := b.place(prog, v, eval)
	shape := v.Type.Dims
	if v.Type.Batched {
		shape = append([]int64{prog.Batch}, shape...)
	}
	return trainer.Tensor{Name: name, Shape: shape, Arena: a, Offset: o}, err
}

// launchPlace is where v lives during training launch l, by the plan's
// step (stepLayout); ok is false where the layout has no steps.
func (b *specBuilder) launchPlace(prog *codegen.Program, v *ir.Value, l *codegen.Launch, eval bool) (int64, bool) {
	sl, ok := b.p.TrainPlace.(stepLayout)
	if eval || !ok {
		return 0, false
	}
	if o, ok := sl.OffsetIn(v, l); ok {
		return o, true
	}
	return sl.OffsetIn(prog.Buffer(v), l)
}

// addPersistent adds the parameters, buffers (with their initialisation)
// and optimizer state to spec.
func (b *specBuilder) addPersistent(spec *trainer.Spec) error {
	g := b.p.Result.Graph
	for _, par := range g.Params {
		t, err := b.tensor(b.p.Train, par.Value, par.Name, false)
		if err != nil {
			return err
		}
		setInit(&t, par)
		spec.Params = append(spec.Params, t)
	}
	for _, par := range g.Buffers {
		t, err := b.tensor(b.p.Train, par.Value, par.Name, false)
		if err != nil {
			return err
		}
		setInit(&t, par)
		spec.Buffers = append(spec.Buffers, t)
	}
	for _, s := range g.State {
		t, err := b.tensor(b.p.Train, s, "optimizer."+s.Name, false)
		if err != nil {
			return err
		}
		spec.State = append(spec.State, t)
	}
	return nil
}

// stepLayout places a value for one launch (PlanLayout does).
type stepLayout interface {
	OffsetIn(v *ir.Value, l *codegen.Launch) (int64, bool)
}

func buildStep(prog *codegen.Program, g *ir.Graph, eval bool, launchPlace func(*codegen.Program, *ir.Value, *codegen.Launch, bool) (int64, bool),
	tensor func(*codegen.Program, *ir.Value, string, bool) (trainer.Tensor, error),
	place func(*codegen.Program, *ir.Value, bool) (trainer.Arena, int64, error)) (trainer.Step, error) {
	var st trainer.Step
	var err error
	if st.Images, err = tensor(prog, g.Inputs[0], "images", eval); err != nil {
		return st, err
	}
	if st.Labels, err = tensor(prog, g.Inputs[1], "labels", eval); err != nil {
		return st, err
	}
	ce := g.Loss.Def
	if ce == nil || (ce.Op != ir.OpSoftmaxCrossEntropy && ce.Op != ops.LinearCrossEntropyOp) {
		return st, fmt.Errorf("trainergen: the loss is not computed by softmax_cross_entropy or linear_cross_entropy")
	}
	if st.Loss, err = tensor(prog, ce.Outs[0], "loss", eval); err != nil {
		return st, err
	}
	if st.Correct, err = tensor(prog, ce.Outs[2], "correct", eval); err != nil {
		return st, err
	}
	if eval { // evaluation reuses no buffer: its logits stay readable after it runs
		if st.Logits, err = tensor(prog, lossLogits(ce), "logits", eval); err != nil {
			return st, err
		}
	}
	st.Launches, err = stepLaunches(prog, eval, launchPlace, place)
	return st, err
}

// lossLogits is the logits the loss node ce reads: softmax_cross_entropy's
// first input, or the classifier tail's (linear_cross_entropy's) second
// output — its first input is the last linear layer's input.
func lossLogits(ce *ir.Node) *ir.Value {
	if ce.Op == ops.LinearCrossEntropyOp {
		return ce.Outs[1]
	}
	return ce.Ins[0]
}

// stepLaunches are prog's launches with their arguments placed.
func stepLaunches(prog *codegen.Program, eval bool, launchPlace func(*codegen.Program, *ir.Value, *codegen.Launch, bool) (int64, bool),
	place func(*codegen.Program, *ir.Value, bool) (trainer.Arena, int64, error)) ([]trainer.Launch, error) {
	var out []trainer.Launch
	var err error
	for _, l := range prog.Launches {
		tl := trainer.Launch{Kernel: l.Kernel, Grid: l.Grid, Block: l.Block, SharedBytes: l.SharedBytes, FLOPs: l.FLOPs, MinBytes: l.MinBytes}
		for _, a := range l.Args {
			ta := trainer.Arg{Kind: a.Kind, Int: a.Int, Float: a.Float}
			switch a.Kind {
			case kernelarg.Buffer:
				if ll, ok := launchPlace(prog, a.Value, l, eval); ok {
					ta.Arena, ta.Offset = trainer.TrainArena, ll
				} else if ta.Arena, ta.Offset, err = place(prog, a.Value, eval); err != nil {
					return nil, err
				}
				ta.Offset += a.Offset // a micro-batch's slice
			case kernelarg.Int, kernelarg.Float, kernelarg.Scalars:
			default:
				return nil, fmt.Errorf("trainergen: kernel %s: unknown argument kind %d", l.Kernel, a.Kind)
			}
			tl.Args = append(tl.Args, ta)
		}
		out = append(out, tl)
	}
	return out, nil
}

// persistentValue: the values that live in the training arena between
// steps (parameters, buffers, optimizer state), which evaluation reads
// where training keeps them.
func persistentValue(v *ir.Value) bool {
	return v.Role == ir.RoleParam || v.Role == ir.RoleOptState || v.Role == ir.RoleBuffer
}

// trainedValue: a persistent value the training arena holds, which
// evaluation reads there; not a folded parameter (ir.Param.Fold) of an
// evaluation graph, which evaluation computes into its own space.
func trainedValue(v *ir.Value) bool {
	return persistentValue(v) && (v.Param == nil || v.Param.Fold == nil)
}

// evalFolds are the folded parameters of evaluation graph g, where
// evaluation's program prog keeps them, with the tensors they are
// computed from (trainer.Spec.EvalFolds).
func (b *specBuilder) evalFolds(prog *codegen.Program, g *ir.Graph) ([]trainer.Tensor, error) {
	var out []trainer.Tensor
	for _, par := range g.Params {
		f := par.Fold
		if f == nil {
			continue
		}
		t, err := b.tensor(prog, par.Value, par.Name, true)
		if err != nil {
			return nil, err
		}
		t.Fold = trainerFold(f)
		out = append(out, t)
	}
	return out, nil
}

// trainerFold is f as the Spec carries it.
func trainerFold(f *ir.Fold) trainer.Fold {
	return trainer.Fold{Bias: f.Bias, Weight: f.Weight, ConvBias: f.ConvBias, Gamma: f.Gamma, Beta: f.Beta, Mean: f.Mean, Var: f.Var, Eps: f.Eps}
}

// setInit gives a parameter's or buffer's tensor its initialisation (as
// reference.InitParam's) and element type.
func setInit(t *trainer.Tensor, par *ir.Param) {
	t.InitBound = reference.InitBound(par.Init)
	if par.Init.Kind == ir.InitOnes {
		t.InitValue = 1
	}
	if par.Value.Type.DType == ir.I64 {
		t.DType = trainer.DTypeI64
	}
}
