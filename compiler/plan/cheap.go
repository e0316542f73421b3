package plan

import (
	"sort"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Cheap recomputation, part of every plan (budget or none).
//
// A batch norm saves its input for its gradient; the normalised copy and
// the activation after it are saved too when the backward pass reads them
// (the activation's derivative, the next conv's weight gradient). Those
// copies are memory-bound elementwise work on values saved anyway: the
// conv's output and the batch's per-channel statistics. So, like In-Place
// ABN, the planner may free them after the forward pass and recompute
// them just before the backward pass reads them — the same kernels on
// the same saved inputs (the statistics node is never recomputed: it
// writes the running statistics), so the recomputed values are the
// forward pass's bit for bit. It does so wherever that lowers the peak.
//
// A forward node is cheap when it is memory-bound: at most
// cheapFLOPsPerElement FLOPs per batched element it reads or writes
// (activations, batch norm's normalisation, pools, add, dropout; not a
// conv or linear, nor a depthwise conv's 18 FLOPs per output). Dropping a
// saved value drops the chain of cheap forward nodes it is computed from
// back to values the backward pass keeps anyway (saved outputs, inputs,
// parameters), so a recomputation never keeps a forward-only value alive
// into the backward pass.
//
// Compute-bound kernels (convs, linear layers) may be recomputed too, the
// same way, while their FLOPs stay within computeRecomputeShare of the
// step: the greedy takes the largest saved values first, so a stem conv's
// or a projection shortcut's output (many bytes, few FLOPs) goes before a
// 3x3 conv's deeper in the network.
const cheapFLOPsPerElement = 4

// cheap: n's kernel is memory-bound and recomputing it changes nothing
// but time (no buffers written, not the loss).
func (a *analysis) cheap(n *ir.Node) bool {
	elems, ok := a.recomputable(n)
	return ok && n.FLOPs(a.batch) <= ir.MulSat(cheapFLOPsPerElement, elems)
}

// recomputable: running forward node n again changes nothing but time (no
// buffers written, not the loss); elems is the batched elements it reads
// and writes.
func (a *analysis) recomputable(n *ir.Node) (elems int64, ok bool) {
	if n.Phase != ir.Forward || isView(n) || len(n.MutatedInputs()) > 0 || (a.g.Loss != nil && n == a.g.Loss.Def) {
		return 0, false
	}
	for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
		if v.Type.Batched {
			elems += v.Type.Elems(a.batch)
		}
	}
	return elems, elems > 0
}

// computeRecomputeShare bounds the compute-bound recomputation (a conv's
// or linear layer's forward kernel run again) that cheapRecompute may add:
// at most 1/computeRecomputeShare of the step's FLOPs. Such a kernel is
// recomputed, like the memory-bound ones, from values the backward pass
// keeps anyway (its saved input), bit for bit — a stem conv with few
// input channels or a 1x1 projection shortcut has a large output for few
// FLOPs; ResNet-18's first block's 3x3 convs fit the share too. At 5% of
// the step this is what lets VGG-small and ResNet-18 hold about half of
// PyTorch's saved activations (BENCHMARKS.md).
const computeRecomputeShare = 20

// cheapClosure is the set of forward node IDs to drop so that unit u is
// recomputed from values the backward pass keeps anyway: u and the
// forward nodes it depends on whose outputs are not saved; cost is the
// FLOPs of those that are not cheap. ok is false when one of them cannot
// run again (it writes buffers, or is the loss).
func (a *analysis) cheapClosure(u int, isUnitOut map[*ir.Value]bool) (ids []int, cost int64, ok bool) {
	seen := map[*ir.Node]bool{}
	stack := []*ir.Node{a.fwd[u]}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n] {
			continue
		}
		seen[n] = true
		if _, ok := a.recomputable(n); !ok {
			return nil, 0, false
		}
		if !a.cheap(n) {
			cost += n.FLOPs(a.batch)
		}
		ids = append(ids, n.ID)
		for _, v := range n.Ins {
			r := root(v)
			if r.Def == nil || isUnitOut[r] {
				continue
			}
			stack = append(stack, r.Def)
		}
	}
	return ids, cost, true
}

// cheapRecompute is the plan from cur that recomputes what is cheap to
// recompute, its updates split where that helps (descend): recomputing
// memory-bound kernels only, or — where that lowers the arena by at least
// 1/minComputeGain more — compute-bound ones too within
// computeRecomputeShare of the step (searched from cur and from the
// memory-bound plan: the greedy's start decides where it ends).
func (a *analysis) cheapRecompute(cur *candidate) *candidate {
	mem := a.descend(a.cheapDrops(cur, 0))
	best := mem
	allowance := (cur.flops - cur.extra) / computeRecomputeShare
	for _, from := range []*candidate{cur, mem} {
		if c := a.descend(a.cheapDrops(from, allowance)); worthFLOPs(c, mem) && a.better(c, best) {
			best = c
		}
	}
	return best
}

// cheapDrops drops cheap saved values from cur while that lowers the
// arena (or, at an equal arena, the bytes live at the peak: a plateau the
// next drop may cross), largest first — those recomputed by compute-bound
// kernels while their FLOPs fit allowance — then takes back the drops the
// final plan does not need (fewest recomputed FLOPs for that arena).
func (a *analysis) cheapDrops(cur *candidate, allowance int64) *candidate {
	isUnitOut := map[*ir.Value]bool{}
	for _, u := range a.units {
		for _, o := range a.fwd[u].Outs {
			isUnitOut[o] = true
		}
	}
	type option struct {
		ids   []int // the unit's node first, then what it is computed from
		bytes int64
		cost  int64 // FLOPs of the compute-bound nodes among ids
	}
	var opts []option
	for _, u := range a.units {
		if ids, cost, ok := a.cheapClosure(u, isUnitOut); ok {
			opts = append(opts, option{ids, a.saved[u], cost})
		}
	}
	if len(opts) == 0 {
		return cur
	}
	sort.SliceStable(opts, func(i, j int) bool { return opts[i].bytes > opts[j].bytes })
	base := cur.d
	chosen := make([]bool, len(opts))
	with := func(flip int) decisions {
		d := base.clone()
		for i, o := range opts {
			if chosen[i] != (i == flip) {
				for _, id := range o.ids {
					d.drop[id] = true
				}
			}
		}
		return d
	}
	lower := func(c *candidate) bool {
		return c.arena < cur.arena || (c.arena == cur.arena && c.maxLive < cur.maxLive)
	}
	var spent int64
	for round := 0; round < 3; round++ {
		improved := false
		for i, o := range opts {
			if chosen[i] || spent+o.cost > allowance {
				continue
			}
			if c, err := a.evaluate(with(i)); err == nil && lower(c) {
				cur, improved, chosen[i] = c, true, true
				spent += o.cost
			}
		}
		if !improved {
			break
		}
	}
	// undo what the final plan does not need: a drop whose return keeps
	// the arena and the bytes live at the peak
	for i := len(opts) - 1; i >= 0; i-- {
		if !chosen[i] {
			continue
		}
		if c, err := a.evaluate(with(i)); err == nil && c.arena <= cur.arena && c.maxLive <= cur.maxLive {
			cur, chosen[i] = c, false
		}
	}
	return cur
}

// worthFLOPs: candidate c, which recomputes compute-bound kernels, has an
// arena at least 1/minComputeGain below cur's, which recomputes only
// memory-bound ones (not a few bytes of alignment for a conv's FLOPs).
func worthFLOPs(c, cur *candidate) bool {
	return c.extra > cur.extra && c.arena <= cur.arena-cur.arena/minComputeGain
}

// minComputeGain: see worthFLOPs.
const minComputeGain = 100
