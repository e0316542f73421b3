package plan

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
)

// materialize turns the chosen candidate into a Plan and checks it.
func (a *analysis) materialize(c *candidate, cfg Config, strategy string) (*Plan, error) {
	if c.arena > c.maxLive {
		// the search placed quickly; the plan gets the careful placement
		// (which starts from the quick one, so it is never worse)
		c.arena = place(c.bufs, a.align, placeEffort)
	}
	last := len(c.steps) - 1
	p := &Plan{Model: c.g.Name, Inference: c.g.Infer, Batch: a.batch, Accumulate: accumulation(cfg), BudgetBytes: max(cfg.Budget, 0), Alignment: a.align,
		ArenaBytes: c.arena, PeakBytes: c.arena, MaxLiveBytes: c.maxLive, FLOPs: c.flops, ExtraFLOPs: c.extra, Graph: c.g}
	for i, l := range c.live {
		if l == c.maxLive {
			p.PeakStep = i
			break
		}
	}
	views := map[*ir.Value][]string{}
	for _, n := range c.g.Nodes {
		if isView(n) {
			r := root(n.Out())
			views[r] = append(views[r], n.Out().Name)
		}
	}
	for _, b := range c.bufs {
		first := b.insts[0]
		pb := &Buffer{ID: b.id, Name: first.v.Name, Category: first.cat, Samples: first.samples, Bytes: b.bytes,
			Offset: b.offset, FirstStep: b.first, LastStep: b.last, Loop: b.loop, Persistent: first.persistent, Owner: b.owner, RangeElems: b.rangeElems,
			Recomputed: first.recomputed, Pos: source(first.v.Pos)}
		pb.Type = typeAt(first.v.Type, first.samples)
		if first.recomputed {
			pb.Name += " (recomputed)"
		}
		for _, x := range b.insts {
			h := Held{Value: x.v.Name, Category: x.cat, FirstStep: max(x.def, 0), LastStep: max(x.lastRead, x.def, 0), InPlace: x.prev != nil, Views: views[x.v]}
			if x.keep || x.persistent {
				h.LastStep = last
			}
			pb.Holds = append(pb.Holds, h)
		}
		p.Buffers = append(p.Buffers, pb)
	}
	for i, s := range c.steps {
		n := s.node
		ps := &Step{Index: i, Kernel: n.Op.String(), Layer: n.Name, NodeID: n.ID, Phase: phaseOf(s).String(),
			Recompute: s.recompute, Loop: s.loop, Samples: a.batch, Accumulate: s.accumulate,
			FLOPs: c.stepFLOPs(a, s), LiveBytes: c.live[i], Pos: source(n.Pos), Text: n.Text(), Node: n, Workspace: -1}
		for _, b := range c.bufs {
			if b.insts[0].cat == CatWorkspace && b.first == i {
				ps.Workspace = b.id
			}
		}
		if s.loop >= 0 {
			ps.Samples = c.loops[s.loop].micro
		}
		ps.Updates = updatedParams(n)
		for j, in := range s.ins {
			ps.Ins = append(ps.Ins, Operand{Value: n.Ins[j].Name, Buffer: in.buf.id, Slice: s.loop >= 0 && in.loop < 0 && in.v.Type.Batched})
		}
		for j, out := range s.outs {
			ps.Outs = append(ps.Outs, Operand{Value: n.Outs[j].Name, Buffer: out.buf.id, Slice: s.loop >= 0 && out.loop < 0 && out.v.Type.Batched, InPlace: out.prev != nil})
			if out.prev != nil {
				p.Choices.InPlace = append(p.Choices.InPlace, fmt.Sprintf("%s over %s", out.v.Name, out.prev.v.Name))
			}
		}
		if s.recompute && !has(p.Choices.Recompute, layerName(n)) {
			p.Choices.Recompute = append(p.Choices.Recompute, layerName(n))
		}
		p.Steps = append(p.Steps, ps)
	}
	for _, l := range c.loops {
		pl := &Loop{FirstStep: l.first, LastStep: l.last, MicroBatch: l.micro, Count: l.count, What: l.what, Zero: []int{}}
		for _, b := range c.bufs {
			if b.insts[0].accum && b.insts[0].def >= l.first && b.insts[0].def <= l.last {
				pl.Zero = append(pl.Zero, b.id)
			}
		}
		p.Loops = append(p.Loops, pl)
	}
	bufOf := map[*ir.Value]int{}
	for _, in := range c.insts {
		if in.def < 0 {
			bufOf[in.v] = in.buf.id
		}
	}
	for _, pr := range c.g.Params {
		pp := Param{Name: pr.Name, Shape: pr.Value.Type.Dims, Init: pr.Init.String(), Buffer: bufOf[pr.Value], State: []int{}}
		for _, s := range pr.State {
			pp.State = append(pp.State, bufOf[s])
		}
		p.Params = append(p.Params, pp)
	}
	for _, pr := range c.g.Buffers {
		p.ModelBuffers = append(p.ModelBuffers, Param{Name: pr.Name, Shape: pr.Value.Type.Dims, Init: pr.Init.String(), Buffer: bufOf[pr.Value], State: []int{}})
	}
	split := map[string]bool{}
	for _, w := range c.split {
		split[w.Name] = true
		p.Choices.SplitUpdates = append(p.Choices.SplitUpdates, w.Name)
	}
	for _, w := range a.fusedUpdates {
		if !split[w.Name] {
			p.Choices.FusedUpdates = append(p.Choices.FusedUpdates, w.Name)
		}
	}
	p.Choices.MicroBatch = a.batch
	switch c.d.loop {
	case stepLoop:
		p.Choices.MicroBatched, p.Choices.MicroBatch = "step", c.d.micro
	case trunkLoop:
		p.Choices.MicroBatched, p.Choices.MicroBatch = "trunk", c.d.micro
		for _, n := range a.fwd[:c.d.cut+1] {
			p.Choices.Trunk = append(p.Choices.Trunk, layerName(n))
		}
	}
	p.Choices.Strategy = strategy
	p.Clip = clipCost(c, p)
	if a.dp != nil {
		p.DataParallel = a.dataParallel(c, p)
	}
	for _, s := range []*[]string{&p.Choices.SplitUpdates, &p.Choices.FusedUpdates, &p.Choices.InPlace, &p.Choices.Recompute, &p.Choices.Trunk} {
		if *s == nil {
			*s = []string{}
		}
	}
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("plan: internal error, the plan is inconsistent: %w", err)
	}
	return p, nil
}

func has(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// typeAt prints a type with the batch dimension filled in.
func typeAt(t ir.Type, samples int64) string {
	s := t.String()
	if t.Batched {
		s = strings.Replace(s, "[B", fmt.Sprintf("[%d", samples), 1)
	}
	return s
}

// Check verifies the plan's invariants: the arena is exactly the planned
// peak and holds every buffer at an aligned offset; no two buffers live at
// the same time overlap; every operand's buffer is live at its step; the
// live bytes per step add up; loops are contiguous and their steps say so;
// the scheduled graph verifies. Build runs it on every plan it returns.
func (p *Plan) Check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.PeakBytes != p.ArenaBytes {
		bad("peak %d != arena %d", p.PeakBytes, p.ArenaBytes)
	}
	var top int64
	for i, b := range p.Buffers {
		if b.ID != i {
			bad("buffer %s has id %d at index %d", b.Name, b.ID, i)
		}
		if p.Alignment > 0 && b.Offset%p.Alignment != 0 {
			bad("buffer %s at offset %d is not %d-aligned", b.Name, b.Offset, p.Alignment)
		}
		if b.Offset < 0 || b.Bytes < 0 {
			bad("buffer %s has offset %d, %d bytes", b.Name, b.Offset, b.Bytes)
		}
		top = max(top, b.Offset+b.Bytes)
		if b.FirstStep > b.LastStep || b.LastStep >= len(p.Steps) {
			bad("buffer %s live range %d..%d", b.Name, b.FirstStep, b.LastStep)
		}
	}
	if top != p.ArenaBytes {
		bad("buffers reach %d bytes, the arena is %d", top, p.ArenaBytes)
	}
	byOffset := append([]*Buffer(nil), p.Buffers...)
	sort.Slice(byOffset, func(i, j int) bool { return byOffset[i].Offset < byOffset[j].Offset })
	for i, x := range byOffset {
		for _, y := range byOffset[i+1:] {
			if y.Offset >= x.Offset+x.Bytes {
				break
			}
			if x.Owner > 0 && y.Owner > 0 && x.Owner != y.Owner {
				continue // two ranks' shards: no rank holds both
			}
			if x.Bytes > 0 && y.Bytes > 0 && x.FirstStep <= y.LastStep && y.FirstStep <= x.LastStep {
				bad("buffers %s [%d,%d) steps %d..%d and %s [%d,%d) steps %d..%d overlap", x.Name, x.Offset, x.Offset+x.Bytes,
					x.FirstStep, x.LastStep, y.Name, y.Offset, y.Offset+y.Bytes, y.FirstStep, y.LastStep)
			}
		}
	}
	live := make([]int64, len(p.Steps))
	shares := map[int]int64{}
	for _, b := range p.Buffers {
		if b.Owner > 0 {
			if !b.Persistent {
				bad("buffer %s of rank %d's optimizer state is not persistent", b.Name, b.Owner-1)
			}
			shares[b.Owner] += b.Bytes
			continue
		}
		for s := b.FirstStep; s <= b.LastStep && s < len(live); s++ {
			live[s] += b.Bytes
		}
	}
	for s := range live {
		live[s] += maxShare(shares)
	}
	var maxLive int64
	for i, s := range p.Steps {
		if s.Index != i {
			bad("step %d has index %d", i, s.Index)
		}
		if s.LiveBytes != live[i] {
			bad("step %d: %d live bytes recorded, buffers add up to %d", i, s.LiveBytes, live[i])
		}
		maxLive = max(maxLive, live[i])
		for _, o := range append(append([]Operand{}, s.Ins...), s.Outs...) {
			if o.Buffer < 0 || o.Buffer >= len(p.Buffers) {
				bad("step %d: %s has no buffer", i, o.Value)
				continue
			}
			if b := p.Buffers[o.Buffer]; i < b.FirstStep || i > b.LastStep {
				bad("step %d (%s) uses %s in buffer %s, live only over steps %d..%d", i, s.Kernel, o.Value, b.Name, b.FirstStep, b.LastStep)
			}
		}
		if s.Loop >= len(p.Loops) {
			bad("step %d is in loop %d of %d", i, s.Loop, len(p.Loops))
		}
	}
	if maxLive != p.MaxLiveBytes {
		bad("max live %d, recorded %d", maxLive, p.MaxLiveBytes)
	}
	if maxLive > p.ArenaBytes {
		bad("%d bytes live at once in a %d-byte arena", maxLive, p.ArenaBytes)
	}
	for li, l := range p.Loops {
		for i := range p.Steps {
			in := i >= l.FirstStep && i <= l.LastStep
			if in != (p.Steps[i].Loop == li) {
				bad("step %d and loop %d (steps %d..%d) disagree", i, li, l.FirstStep, l.LastStep)
			}
		}
		if l.MicroBatch < 1 || l.Count != (p.Batch+l.MicroBatch-1)/l.MicroBatch {
			bad("loop %d: %d micro-batches of %d for a batch of %d", li, l.Count, l.MicroBatch, p.Batch)
		}
	}
	if p.Graph != nil {
		if err := p.Graph.Verify(); err != nil {
			bad("the scheduled graph: %v", err)
		}
	}
	return errors.Join(errs...)
}

// updatedParams names the parameters node n updates: the first input of
// a separate update, the parameters of a kernel with its update fused.
func updatedParams(n *ir.Node) []string {
	var names []string
	for _, p := range n.UpdatedParams() {
		names = append(names, p.Name)
	}
	return names
}

// accumulation is Plan.Accumulate for cfg: its accumulate when above 1.
func accumulation(cfg Config) int64 {
	if cfg.Accumulate > 1 {
		return cfg.Accumulate
	}
	return 0
}

// clipCost is the plan's ClipCost when the graph clips its gradients: the
// update-phase step that computes what the updates read (ir.OpInfo's
// UpdateInput: clip_grad_norm) and the separate updates.
func clipCost(c *candidate, p *Plan) *ClipCost {
	if c.g.ClipGradNorm <= 0 {
		return nil
	}
	cc := &ClipCost{MaxNorm: c.g.ClipGradNorm, NormStep: -1}
	for i, s := range c.steps {
		info := s.node.Op.Info()
		switch {
		case info.UpdateInput && cc.NormStep < 0:
			cc.NormStep, cc.LiveBytes, cc.NormFLOPs = i, c.live[i], p.Steps[i].FLOPs
			for _, in := range s.ins {
				if in.cat == CatGrad {
					cc.GradientBytes += in.buf.bytes
				}
			}
		case info.Update:
			cc.Updates++
		}
	}
	return cc
}
