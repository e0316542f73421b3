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
const cheapFLOPsPerElement = 4

// cheap: n's kernel is memory-bound and recomputing it changes nothing
// but time (no buffers written, not the loss).
func (a *analysis) cheap(n *ir.Node) bool {
	if n.Phase != ir.Forward || isView(n) || len(n.MutatedInputs()) > 0 || (a.g.Loss != nil && n == a.g.Loss.Def) {
		return false
	}
	var elems int64
	for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
		if v.Type.Batched {
			elems += v.Type.Elems(a.batch)
		}
	}
	return elems > 0 && n.FLOPs(a.batch) <= ir.MulSat(cheapFLOPsPerElement, elems)
}

// cheapClosure is the set of forward node IDs to drop so that unit u is
// recomputed from values the backward pass keeps anyway: u and the cheap
// forward nodes it depends on whose outputs are not saved. ok is false
// when one of those is not cheap.
func (a *analysis) cheapClosure(u int, isUnitOut map[*ir.Value]bool) (ids []int, ok bool) {
	seen := map[*ir.Node]bool{}
	stack := []*ir.Node{a.fwd[u]}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n] {
			continue
		}
		seen[n] = true
		if !a.cheap(n) {
			return nil, false
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
	return ids, true
}

// cheapRecompute drops cheap saved values from cur while that lowers the
// arena (or, at an equal arena, the bytes live at the peak: a plateau the
// next drop may cross), largest first, then takes back the drops the
// final plan does not need (fewest recomputed FLOPs for that arena).
func (a *analysis) cheapRecompute(cur *candidate) *candidate {
	isUnitOut := map[*ir.Value]bool{}
	for _, u := range a.units {
		for _, o := range a.fwd[u].Outs {
			isUnitOut[o] = true
		}
	}
	type option struct {
		ids   []int // the unit's node first, then what it is computed from
		bytes int64
	}
	var opts []option
	for _, u := range a.units {
		if ids, ok := a.cheapClosure(u, isUnitOut); ok {
			opts = append(opts, option{ids, a.saved[u]})
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
	for round := 0; round < 3; round++ {
		improved := false
		for i := range opts {
			if chosen[i] {
				continue
			}
			if c, err := a.evaluate(with(i)); err == nil && lower(c) {
				cur, improved, chosen[i] = c, true, true
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
