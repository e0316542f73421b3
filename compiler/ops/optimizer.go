package ops

import (
	"fmt"
	"sort"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Optimizer is everything cnnc knows of one optimizer, the optimizers'
// counterpart of Def: its train-block call, hyper-parameters and defaults,
// the state it keeps per parameter, the op that updates a parameter, its
// FLOPs, the float64 update and the kernel template that updates one
// element. Each optimizer's file registers one (sgd.go, adam.go).
type Optimizer struct {
	// OptimizerInfo is what the IR keeps: name, state names, update op,
	// FLOPs, printed form.
	ir.OptimizerInfo
	Kind ir.OptimizerKind
	// Order places it in the docs and in suggestions.
	Order int
	Args  []ArgSpec
	// Make builds the optimizer from its checked arguments (defaults for
	// the ones left out); an error concerns a combination of them and is
	// reported at the call.
	Make func(a Args) (ir.Optimizer, error)
	// Ref updates one parameter in float64: p in place from its gradient g,
	// with its state (in StateNames' order) updated in place; step is the
	// 0-based training step.
	Ref func(o *ir.Optimizer, step int64, p, g []float64, state [][]float64)
	// Template names the blocks of templates/update.cu.tmpl that update
	// one element in kernels: "opt_prologue_T" (once per thread) and
	// "opt_step_T".
	Template string
	// KernelName gives the parts of a kernel name that say the compiled-in
	// hyper-parameters (sgd_mom0p9_nesterov), num writing a number; and
	// KernelDoc describes them for a kernel's comment.
	KernelName func(o *ir.Optimizer, num func(float64) string) []string
	KernelDoc  func(o *ir.Optimizer) string
	Doc        string
	PyTorch    string
}

var (
	optimizers       = map[ir.OptimizerKind]*Optimizer{}
	optimizersByName = map[string]*Optimizer{}
)

// RegisterOptimizer adds an optimizer with a fixed identity (ir.SGD, ...)
// to the table; NewOptimizer one that gets its identity now.
func RegisterOptimizer(k ir.OptimizerKind, o *Optimizer) ir.OptimizerKind {
	o.Kind = ir.DefineOptimizer(k, o.OptimizerInfo)
	addOptimizer(o)
	return o.Kind
}

// NewOptimizer adds an optimizer and returns its identity.
func NewOptimizer(o *Optimizer) ir.OptimizerKind {
	o.Kind = ir.NewOptimizer(o.OptimizerInfo)
	addOptimizer(o)
	return o.Kind
}

func addOptimizer(o *Optimizer) {
	if _, dup := optimizersByName[o.Name]; dup {
		panic(fmt.Sprintf("ops: two optimizers are named %s", o.Name))
	}
	optimizers[o.Kind] = o
	optimizersByName[o.Name] = o
}

// OptimizerOf returns the optimizer of kind k, or an error naming it.
func OptimizerOf(k ir.OptimizerKind) (*Optimizer, error) {
	if o := optimizers[k]; o != nil {
		return o, nil
	}
	return nil, fmt.Errorf("unknown optimizer %s", k)
}

// OptimizerByName finds the optimizer a train block calls name.
func OptimizerByName(name string) *Optimizer { return optimizersByName[name] }

// Optimizers lists the optimizers in the docs' order.
func Optimizers() []*Optimizer {
	var out []*Optimizer
	for _, o := range optimizers {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Order < out[j].Order })
	return out
}

// MissingOptimizer names what an optimizer lacks.
func MissingOptimizer(o *Optimizer) []string {
	var m []string
	need := func(ok bool, what string) {
		if !ok {
			m = append(m, what)
		}
	}
	need(o.Name != "", "a name")
	need(o.Doc != "", "a doc string")
	need(o.States != nil, "its state names (States)")
	need(o.FLOPs != nil, "its FLOPs")
	need(o.Text != nil, "its printed form (Text)")
	need(o.Make != nil, "its constructor (Make)")
	need(o.Ref != nil, "its float64 update (Ref)")
	need(o.Template != "", "its kernel template (Template)")
	need(o.KernelName != nil && o.KernelDoc != nil, "its kernel name and doc (KernelName, KernelDoc)")
	need(o.UpdateOp.Defined() && Of(o.UpdateOp) != nil && Of(o.UpdateOp).Update, "an update op (UpdateOp, an op with Update set)")
	for _, a := range o.Args {
		need(a.Doc != "", "a doc string for argument "+a.Name)
	}
	return m
}

// updateAttrs: the optimizer is the update ops' one attribute.
var updateAttrs = []ir.AttrSpec{ir.AttrOpt}

// inferUpdate is the type rule of every update op: (param, grad, state...)
// of the parameter's type, then with gradient clipping the coefficient
// (clip_grad_norm's output); no outputs.
func inferUpdate(n *ir.Node) ([]ir.Type, error) {
	if n.Attrs.Opt == nil {
		return nil, fmt.Errorf("%s has no optimizer", n.Op)
	}
	p := n.Ins[0]
	if p.Role != ir.RoleParam {
		return nil, fmt.Errorf("%s updates %s, which is not a parameter", n.Op, p.Name)
	}
	want := 2 + len(n.Attrs.Opt.StateNames())
	if len(n.Ins) != want && len(n.Ins) != want+1 {
		return nil, fmt.Errorf("%s takes %d inputs (%d with a clipping coefficient), got %d", n.Op, want, want+1, len(n.Ins))
	}
	if c := UpdateClip(n); c != nil && !c.Type.Equal(ClipCoefType) {
		return nil, fmt.Errorf("%s: clipping coefficient %s is %s, want %s", n.Op, c.Name, c.Type, ClipCoefType)
	}
	for _, v := range n.Ins[1:want] {
		if !v.Type.Equal(p.Type) {
			return nil, fmt.Errorf("%s: %s is %s but parameter %s is %s", n.Op, v.Name, v.Type, p.Name, p.Type)
		}
	}
	return nil, nil
}

// flopsUpdate: the optimizer's FLOPs per element, times the parameter's.
func flopsUpdate(n *ir.Node) int64 {
	info, err := n.Attrs.Opt.Info()
	if err != nil {
		return 0
	}
	per := info.FLOPs(n.Attrs.Opt)
	if UpdateClip(n) != nil {
		per++ // the gradient times the clipping coefficient
	}
	return ir.MulSat(per, n.Ins[0].Type.SampleElems())
}

// refUpdate is every update op's reference kernel: the optimizer's Ref on
// (param, grad, state...), in place, the gradient first multiplied by the
// clipping coefficient where there is one (torch's clip_grad_norm_ scales
// the gradients before optimizer.step()).
func refUpdate(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	o, err := OptimizerOf(n.Attrs.Opt.Kind)
	if err != nil {
		panic(err) // the verifier rejects unknown optimizers before anything runs
	}
	per := len(n.Attrs.Opt.StateNames())
	grad := ins[1]
	if UpdateClip(n) != nil {
		coef := ins[2+per][0]
		grad = make([]float64, len(ins[1]))
		for i, g := range ins[1] {
			grad[i] = g * coef
		}
	}
	o.Ref(n.Attrs.Opt, env.Step, ins[0], grad, ins[2:2+per])
	return nil
}

// updateDef is the definition of an optimizer's update op.
func updateDef(name, doc string) *Def {
	return &Def{
		OpInfo: ir.OpInfo{Name: name, Attrs: updateAttrs, Infer: inferUpdate, FLOPs: flopsUpdate, Update: true},
		Doc:    doc,
		NoGrad: "an optimizer update",
		Ref:    refUpdate,
		Kernel: Kernel{Custom: "update"},
	}
}
