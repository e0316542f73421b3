package codegen

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// Optimizer updates: the standalone sgd_update / adam_update kernels (for
// parameters whose gradient is accumulated before the update, e.g. over
// micro-batches) and the update fused into weight-gradient epilogues share
// the "opt_step" template. Hyper-parameters are compiled in; the learning
// rate (trainers may schedule it) and the step are read at run time from
// the step's scalar block: a kernel that updates parameters takes
// scalarsParam, which "opt_prologue" reads. The standalone kernels update
// the elements [first, end) of their last two arguments only (the whole
// tensor unless a sharded optimizer's rank gives its range: UpdateRangeArgs),
// each element with the same arithmetic, so a range's bits are the whole
// update's.

const updateBlock = 256

func init() {
	register(ir.OpSGDUpdate, updateRule)
	register(ir.OpAdamUpdate, updateRule)
}

// optSite is one parameter's update: the optimizer's template (its table
// row in compiler/ops), its constants as C literals, and the C expressions
// of the gradient (G), the parameter (P) and its state (S0, S1) for the
// element being updated.
type optSite struct {
	Kind, Template              string // the optimizer, and its blocks in update.cu.tmpl
	HasWD, HasMomentum          bool
	Nesterov                    bool
	WD, Momentum                string
	Beta1, Beta2, OneMinusBeta1 string
	OneMinusBeta2, Eps          string
	Beta1D, Beta2D              string // double literals for the bias corrections
	G, P, S0, S1                string
}

// newOptSite fills the constants of opt; param is the parameter's pointer
// name, states its state pointers' names, at the element index expression.
// An optimizer the table does not know fails when the template runs
// (unknownOptimizer).
func newOptSite(opt *ir.Optimizer, g, param string, states []string, at string) *optSite {
	template := ""
	if o, err := ops.OptimizerOf(opt.Kind); err == nil {
		template = o.Template
	}
	s := &optSite{
		Kind: opt.Kind.String(), Template: template,
		HasWD: opt.WeightDecay != 0, WD: cFloat(opt.WeightDecay),
		HasMomentum: opt.Momentum != 0, Momentum: cFloat(opt.Momentum), Nesterov: opt.Nesterov,
		Beta1: cFloat(opt.Beta1), Beta2: cFloat(opt.Beta2),
		OneMinusBeta1: cFloat(1 - opt.Beta1), OneMinusBeta2: cFloat(1 - opt.Beta2),
		Eps: cFloat(opt.Eps), Beta1D: cDouble(opt.Beta1), Beta2D: cDouble(opt.Beta2),
		G: g, P: param + "[" + at + "]",
	}
	if len(states) > 0 {
		s.S0 = states[0] + "[" + at + "]"
	}
	if len(states) > 1 {
		s.S1 = states[1] + "[" + at + "]"
	}
	return s
}

// UpdateRangeArgs locates the element range of a standalone update launch
// (either target's: both take it after the step's scalars): its arguments
// first and first+1 are the first element it updates and the end of its
// range ([0, N) as generated; a sharded optimizer's rank sets its own
// range there, with the state arguments pointing at the range's first
// element, as the rank keeps only the range's state). ok is false for any
// other launch.
func UpdateRangeArgs(l *Launch) (first int, ok bool) {
	if l.Node == nil || (l.Node.Op != ir.OpSGDUpdate && l.Node.Op != ir.OpAdamUpdate) || len(l.Args) < 5 {
		return 0, false
	}
	first = len(l.Args) - 2
	if l.Args[first].Kind != kernelarg.Int || l.Args[first+1].Kind != kernelarg.Int || l.Args[first-1].Kind != kernelarg.Scalars {
		return 0, false
	}
	return first, true
}

// cFloat is v as a C float literal (rounded to float32 as the kernel uses it).
func cFloat(v float64) string {
	s := strconv.FormatFloat(float64(float32(v)), 'g', -1, 32)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s + "f"
}

// cDouble is v as a C double literal.
func cDouble(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}

// nameNumber writes a number for a kernel name: 0.9 -> 0p9, 1e-08 -> 1em08.
func nameNumber(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	return strings.NewReplacer(".", "p", "-", "m", "+", "").Replace(s)
}

// optName describes an optimizer's compiled-in constants for kernel names:
// sgd, sgd_mom0p9_nesterov_wd0p01, adam_b0p9_0p999_eps1em08, adamw_..._wd0p01.
func optName(o *ir.Optimizer) string {
	parts := []string{o.Kind.String()}
	if def, err := ops.OptimizerOf(o.Kind); err == nil {
		parts = def.KernelName(o, nameNumber)
	}
	if o.WeightDecay != 0 {
		parts = append(parts, "wd"+nameNumber(o.WeightDecay))
	}
	return strings.Join(parts, "_")
}

// optDoc describes the update for a kernel's comment.
func optDoc(o *ir.Optimizer) string {
	what := o.Kind.String()
	if def, err := ops.OptimizerOf(o.Kind); err == nil {
		what = def.KernelDoc(o)
	}
	return what + ", learning rate and step from the step's scalars"
}

// indexType is the C type that holds every index below maxIndex: int
// where it fits (cheaper address arithmetic), else long.
func indexType(maxIndex ...int64) string {
	for _, m := range maxIndex {
		if m >= 1<<31-1 {
			return "long"
		}
	}
	return "int"
}

// stateParams names a parameter's optimizer state pointers: w_momentum_buffer, w_exp_avg, ...
func stateParams(param string, opt *ir.Optimizer) []string {
	var out []string
	for _, s := range opt.StateNames() {
		out = append(out, param+"_"+s)
	}
	return out
}

// updateRule: sgd_update / adam_update(param, grad, state...) in place.
func updateRule(e *emitter, n *ir.Node) error {
	opt := n.Attrs.Opt
	if opt == nil {
		return fmt.Errorf("codegen: %s has no optimizer", n.Text())
	}
	if _, err := ops.OptimizerOf(opt.Kind); err != nil {
		return fmt.Errorf("codegen: %s: %v", n.Text(), err)
	}
	p := n.Ins[0]
	elems := p.Type.SampleElems()
	states := stateParams("param", opt)
	clip := ops.UpdateClip(n) != nil
	if want := 2 + len(states); len(n.Ins) != want && !(clip && len(n.Ins) == want+1) {
		return fmt.Errorf("codegen: %s: %d inputs, want %d", n.Text(), len(n.Ins), want)
	}
	name := fmt.Sprintf("%s_%d_%s", n.Op, elems, optName(opt))
	params := []string{"float* __restrict__ param", "const float* __restrict__ grad"}
	for _, s := range states {
		params = append(params, "float* __restrict__ "+s)
	}
	g, doc := "grad[at]", optDoc(opt)
	if clip {
		// torch's clip_grad_norm_ multiplies the gradients (rounding the
		// product) before the step: __fmul_rn is never contracted into an
		// FMA with the weight decay, so a coefficient of 1 changes no bit
		name += "_clip"
		params = append(params, "const float* __restrict__ clip")
		g, doc = "__fmul_rn(grad[at], clipCoef)", doc+"; the gradient times the clipping coefficient *clip"
	}
	// the element range [first, end) it updates: the whole tensor, unless a
	// sharded optimizer's rank sets its own range there (UpdateRangeArgs);
	// the state holds the range's elements only
	params = append(params, scalarsParam, "long long first", "long long end")
	site := newOptSite(opt, g, "param", states, "at")
	if len(states) > 0 {
		site.S0 = states[0] + "[at - first]"
	}
	if len(states) > 1 {
		site.S1 = states[1] + "[at - first]"
	}
	data := map[string]any{
		"Name": name, "Elems": elems, "Idx": indexType(elems), "Clip": clip,
		"Doc":    fmt.Sprintf("%s of %d parameters: %s.", n.Op, elems, doc),
		"Params": strings.Join(params, ", "),
		"Site":   site,
	}
	if err := e.kernel("update", name, data); err != nil {
		return err
	}
	var args []Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	args = append(args, scalarsArg, Arg{Kind: kernelarg.Int, Int: 0}, Arg{Kind: kernelarg.Int, Int: elems})
	e.launch(&Launch{Node: n, Kernel: name, Grid: gridFor(elems, updateBlock), Block: [3]uint32{updateBlock, 1, 1},
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch) + int64(len(n.Ins)-1)*p.Type.Bytes(e.batch)})
	return nil
}
