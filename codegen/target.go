package codegen

import (
	"errors"
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Targets other than CUDA. The CPU target (codegen/cpu) generates its own
// kernels — C++ for CPU threads — from the same fused graph, through the
// same walk: Generate, GenerateNodes, GenerateFromPlan (micro-batch loops
// unrolled, slices offset, accumulators zeroed) and GenerateEval take it in
// Options.Target and produce a Program of the same shape (kernels,
// launches with IR-value arguments, scratch buffers), which trainergen
// turns into a Spec as it does CUDA's. Only the kernel rules and the
// file's opening text differ; a nil Target is CUDA (the rules registered
// in this package, the templates in templates/).
type Target interface {
	// Name names the target in messages ("cpu").
	Name() string
	// Node adds the kernels and launches of node n (not a view) through e.
	Node(e Emitter, n *ir.Node) error
	// ZeroFill adds, through e, the launch that clears v before n runs (a
	// micro-batch loop's gradient accumulator); it belongs to n.
	ZeroFill(e Emitter, n *ir.Node, v *ir.Value) error
	// Prelude is the generated file's opening text: source is the model
	// file's name and model the model's, both already safe in a comment.
	Prelude(source, model string, batch int64) string
}

// Emitter is what a Target's rules add kernels and launches through.
type Emitter interface {
	// Batch is the number of samples the node's kernels process: the
	// batch, or a micro-batch inside a loop.
	Batch() int64
	// Accumulate says whether the node's kernels add their unbatched
	// outputs (weight gradients, the loss, the correct count) to what the
	// buffers hold: a step of a micro-batch loop, as the plan says.
	Accumulate() bool
	// Eval says whether the program is evaluation's (Options.Eval): batch
	// norm reads its running statistics.
	Eval() bool
	// AddKernel adds k to the program unless a kernel of its name exists
	// (equal names mean equal kernels: each is emitted once).
	AddKernel(k *Kernel)
	// Launch appends a launch to the step.
	Launch(l *Launch)
	// Scratch makes a temporary buffer of type t for node n's launches
	// (see Program.Scratch), named after the node and suffix.
	Scratch(n *ir.Node, suffix string, t ir.Type) *ir.Value
}

func (e *emitter) Batch() int64 { return e.batch }

func (e *emitter) Accumulate() bool { return e.accumulate }
func (e *emitter) Eval() bool       { return e.eval }

func (e *emitter) AddKernel(k *Kernel) {
	if _, ok := e.kernels[k.Name]; ok {
		return
	}
	e.kernels[k.Name] = k
	e.prog.Kernels = append(e.prog.Kernels, k)
}

func (e *emitter) Launch(l *Launch) { e.launch(l) }

func (e *emitter) Scratch(n *ir.Node, suffix string, t ir.Type) *ir.Value {
	return e.scratch(n, suffix, t)
}

// nodeKernels adds node n's kernels and launches for the options' target.
func (e *emitter) nodeKernels(opts Options, n *ir.Node) error {
	if opts.Target != nil {
		err := opts.Target.Node(e, n)
		var nr *NoRuleError
		if err != nil && !errors.As(err, &nr) {
			return fmt.Errorf("codegen (%s target): %w", opts.Target.Name(), err)
		}
		return err
	}
	r, ok := ruleOf(n.Op)
	if !ok {
		return &NoRuleError{Op: n.Op, Node: n.Text()}
	}
	return r(e, n)
}
