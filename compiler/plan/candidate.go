package plan

import (
	"fmt"
	"slices"

	"github.com/cnnc/cnnc/compiler/ir"
)

// loopKind says what part of the step runs in micro-batches.
type loopKind uint8

const (
	noLoop    loopKind = iota
	stepLoop           // the whole forward and backward pass, one loop
	trunkLoop          // forward nodes fwd[0..cut]: a forward loop, then a backward loop that recomputes them
)

// decisions are what distinguishes one candidate plan from another.
type decisions struct {
	// split holds fused weight-gradient node IDs whose update is split
	// off (the layer's weight gradient then runs before its input
	// gradient, into a gradient buffer, and a separate update follows).
	split map[int]bool
	// drop holds forward node IDs whose outputs are freed after the
	// forward pass and recomputed before their first backward use.
	drop  map[int]bool
	loop  loopKind
	cut   int   // trunkLoop: index in fwd of the last trunk node
	micro int64 // loop micro-batch
}

func (d decisions) clone() decisions {
	c := d
	c.split = copySet(d.split)
	c.drop = copySet(d.drop)
	return c
}

func copySet(s map[int]bool) map[int]bool {
	c := map[int]bool{}
	for k, v := range s {
		if v {
			c[k] = true
		}
	}
	return c
}

// candidate is a scheduled, placed plan before it becomes a Plan.
type candidate struct {
	d     decisions
	g     *ir.Graph
	steps []*pstep
	loops []*ploop
	insts []*inst
	bufs  []*buffer
	live  []int64 // bytes live per step
	arena int64
	// maxLive is the largest live; extra and flops count FLOPs.
	maxLive, extra, flops int64
	split                 []*ir.Node // weight-gradient nodes split (in the clone)
	// readyFirst: the backward order runs ready nodes before
	// recomputations (readyBeforeRecomputes); reordered: that order
	// differs from the graph's.
	readyFirst, reordered bool
}

// pstep is a step of a candidate's schedule.
type pstep struct {
	node       *ir.Node
	recompute  bool
	loop       int
	ins, outs  []*inst
	accumulate bool
}

// ploop is a micro-batch loop over steps first..last.
type ploop struct {
	first, last int
	micro       int64
	count       int64
	what        string
}

// inst is one value instance: a value computed by one step (a recomputed
// value is a second instance of the same IR value), or a graph input,
// parameter or state value (def -1).
type inst struct {
	v          *ir.Value
	def        int
	reads      []int
	lastRead   int
	loop       int   // the loop it is local to (every read in its defining loop), or -1
	samples    int64 // batched: the batch or the micro-batch; 0 unbatched
	recomputed bool
	accum      bool // an accumulator of a loop
	keep       bool // read by the host after the step (loss, correct count)
	persistent bool
	cat        Category
	next, prev *inst // in-place chain: next overwrites this one
	buf        *buffer
}

// buffer is a candidate's arena region: one instance, or an in-place chain.
type buffer struct {
	id          int
	insts       []*inst
	bytes       int64
	first, last int
	loop        int
	offset      int64
	// pin > 0 places the buffer in the gradient buckets' region, in pin
	// order, in bucket number bucket (data parallelism: pinBuckets).
	pin, bucket int
	// owner > 0: optimizer state that only rank owner−1 keeps (a sharded
	// optimizer: shardState), placed in the shard region where the ranks'
	// shares overlap.
	owner int
	// rangeElems > 0: optimizer state split in element ranges (a sharded
	// optimizer: shardState): every rank keeps rangeElems elements of it,
	// rank r's from element r·rangeElems, so bytes is one range's; the
	// whole tensor is wholeBytes.
	rangeElems, wholeBytes int64
}

func (i *inst) bytes() int64 {
	if i.v.Type.Batched {
		return i.v.Type.Bytes(i.samples)
	}
	return i.v.Type.Bytes(1)
}

// placeEffort is how many orders the placement's local search tries when
// the quick placement misses a budget the live bytes meet, and for the
// final plan.
const placeEffort = 300

// evaluate schedules and places a candidate; an error means the decisions
// do not give a valid schedule (the search then skips them).
//
// Without a budget (the plan of the smallest peak), a candidate with
// recomputation and no loop is scheduled in two backward orders and the
// smaller arena kept: the graph's, and one where the nodes ready before a
// recomputation that read no dropped value run first
// (readyBeforeRecomputes). Neither is better everywhere: running them
// first frees buffers beside a recomputed chain (ResNet-18's residual
// gradient sums), or makes their outputs live while recomputed values are
// (VGG's and MobileNet's input gradients). Under a budget the graph's
// order alone: those searches evaluate far more candidates (--max-batch
// one search per batch tried), and with both orders the greedy ended
// lower for vgg_small (127 samples within 64 MB, not 136).
func (a *analysis) evaluate(d decisions) (*candidate, error) {
	c, err := a.evaluateOrder(d, false)
	if err != nil || !c.reordered || a.budget > 0 {
		return c, err
	}
	e, err := a.evaluateOrder(d, true)
	if err != nil || e.arena >= c.arena {
		return c, nil
	}
	return e, nil
}

// evaluateOrder is evaluate with the backward order readyFirst says.
func (a *analysis) evaluateOrder(d decisions, readyFirst bool) (*candidate, error) {
	c := &candidate{d: d, g: a.g.Clone(), readyFirst: readyFirst}
	if err := c.schedule(a); err != nil {
		return nil, err
	}
	if err := c.walk(a); err != nil {
		return nil, err
	}
	c.inPlace()
	c.buffers(a)
	c.arena = place(c.bufs, a.align, 0)
	if a.budget > 0 && c.arena > a.budget && c.maxLive <= a.budget {
		// close to the budget: worth a harder look at the placement
		c.arena = place(c.bufs, a.align, placeEffort)
	}
	return c, nil
}

// splitUpdate turns a weight-gradient kernel with a fused update into one
// that writes the gradients, plus one update node per parameter appended
// in the update phase.
func splitUpdate(g *ir.Graph, w *ir.Node) error {
	p, err := w.Parts()
	if err != nil {
		return err
	}
	opt := w.Attrs.Opt
	info, err := opt.Info()
	if err != nil {
		return fmt.Errorf("plan: %s: %v", w.Text(), err)
	}
	op := info.UpdateOp
	w.Attrs.Opt = nil
	w.Ins = w.Ins[:len(w.Ins)-len(p.Params)-len(p.State)]
	per := len(opt.StateNames())
	for i, pv := range p.Params {
		gv := g.NewValue(pv.Name+".grad", pv.Type, ir.RoleGrad, w.Pos)
		gv.Param, gv.Def = pv.Param, w
		w.Outs = append(w.Outs, gv)
		ins := append([]*ir.Value{pv, gv}, p.State[i*per:(i+1)*per]...)
		u := g.NewNode(op, w.Name, ir.Update, w.Pos, ins, nil, 0)
		u.Attrs.Opt = opt
		g.Append(u)
	}
	return nil
}

// schedule applies the splits to the clone and orders the steps:
// forward, then backward (a split layer's weight gradient before its input
// gradient), recomputations just before their first backward use, loops
// as the decisions say, and each separate update as early as its gradient
// and the last read of its parameter allow.
func (c *candidate) schedule(a *analysis) error {
	byID := map[int]*ir.Node{}
	for _, n := range c.g.Nodes {
		byID[n.ID] = n
	}
	splitIDs, err := c.applySplits(a, byID)
	if err != nil {
		return err
	}
	fwd, bwd, upd := phases(c.g)
	bwd = weightGradientsFirst(a, bwd, splitIDs, byID)
	seq, err := c.sequence(a, fwd, bwd)
	if err != nil {
		return err
	}
	if a.dp != nil {
		c.steps = append(seq, steps(upd, -1)...) // after the backward pass and the gradients' sums
	} else {
		c.steps = insertUpdates(seq, upd)
	}
	if err := c.measureLoops(a); err != nil {
		return err
	}
	c.g.Nodes = graphOrder(c.g, c.steps)
	return nil
}

// inLoop says whether node n runs inside the decisions' micro-batch loop.
func (c *candidate) inLoop(a *analysis, n *ir.Node) bool {
	switch c.d.loop {
	case stepLoop:
		return true
	case trunkLoop:
		o := a.ownerOf(n)
		return o >= 0 && o <= c.d.cut
	}
	return false
}

// applySplits splits the fused weight-gradient updates the decisions split,
// and those inside a loop (an update must not run once per micro-batch),
// returning their node IDs.
func (c *candidate) applySplits(a *analysis, byID map[int]*ir.Node) (map[int]bool, error) {
	splitIDs := map[int]bool{}
	for _, w := range a.fusedUpdates {
		if c.d.split[w.ID] || c.inLoop(a, w) || a.dp != nil {
			splitIDs[w.ID] = true
		}
	}
	for _, w := range a.fusedUpdates {
		if splitIDs[w.ID] {
			n := byID[w.ID]
			if err := splitUpdate(c.g, n); err != nil {
				return nil, err
			}
			c.split = append(c.split, n)
		}
	}
	return splitIDs, nil
}

// phases lists g's non-view nodes by phase, in graph order.
func phases(g *ir.Graph) (fwd, bwd, upd []*ir.Node) {
	for _, n := range g.Nodes {
		switch {
		case isView(n):
		case n.Phase == ir.Forward:
			fwd = append(fwd, n)
		case n.Phase == ir.Update:
			upd = append(upd, n)
		default:
			bwd = append(bwd, n)
		}
	}
	return fwd, bwd, upd
}

// weightGradientsFirst moves a split layer's weight gradient, and every
// weight gradient without a fused update, just before its input gradient,
// so the gradient the update needs is ready earliest and the saved input
// the weight gradient reads may die before the input gradient exists.
func weightGradientsFirst(a *analysis, bwd []*ir.Node, splitIDs map[int]bool, byID map[int]*ir.Node) []*ir.Node {
	moved := map[int][]*ir.Node{} // grad_input ID -> the weight gradients to run before it
	skip := map[int]bool{}
	for _, n := range bwd {
		gi, ok := a.partner[n.ID]
		if !ok || !splitIDs[n.ID] {
			gi, ok = a.gradsFirst[n.ID]
		}
		if ok {
			moved[gi] = append(moved[gi], byID[n.ID])
			skip[n.ID] = true
		}
	}
	var ordered []*ir.Node
	for _, n := range bwd {
		if skip[n.ID] {
			continue
		}
		ordered = append(ordered, moved[n.ID]...)
		ordered = append(ordered, n)
	}
	return ordered
}

// steps wraps nodes as steps of loop (-1: none).
func steps(ns []*ir.Node, loop int) []*pstep {
	seq := make([]*pstep, 0, len(ns))
	for _, n := range ns {
		seq = append(seq, &pstep{node: n, loop: loop})
	}
	return seq
}

// sequence orders the forward and backward steps as the decisions' loop
// kind says, and sets c.loops.
func (c *candidate) sequence(a *analysis, fwd, bwd []*ir.Node) ([]*pstep, error) {
	switch c.d.loop {
	case stepLoop:
		c.loops = []*ploop{{micro: c.d.micro, what: "the whole step"}}
		return append(steps(fwd, 0), steps(bwd, 0)...), nil
	case trunkLoop:
		return c.trunkSequence(a, fwd, bwd)
	}
	c.loops = nil
	early := readyBeforeRecomputes(bwd, c.d.drop, fwd)
	c.reordered = !slices.Equal(early, bwd)
	if c.readyFirst {
		bwd = early
	}
	return append(steps(fwd, -1), withRecomputes(bwd, c.d.drop, fwd, -1)...), nil
}

// readyBeforeRecomputes reorders the backward nodes so that, before a node
// that reads a dropped value (where recomputation starts), every later
// node that reads no dropped value and whose inputs are already computed
// runs first (in their order). Those nodes would otherwise run while the
// recomputed values are live — ResNet's residual gradient sum, a split
// layer's input gradient — and the buffers they free (or write in place
// over) would be live beside the recomputed chain. Data dependencies are
// kept: a node moves only ahead of nodes it does not depend on.
func readyBeforeRecomputes(bwd []*ir.Node, drop map[int]bool, fwd []*ir.Node) []*ir.Node {
	dropped := map[*ir.Value]bool{}
	for _, f := range fwd {
		if drop[f.ID] {
			for _, o := range f.Outs {
				dropped[o] = true
			}
		}
	}
	if len(dropped) == 0 {
		return bwd
	}
	pending := map[*ir.Value]bool{} // defined by a backward node not yet placed
	for _, n := range bwd {
		for _, o := range n.Outs {
			pending[o] = true
		}
	}
	readsDropped := func(n *ir.Node) bool {
		for _, v := range n.Ins {
			if dropped[root(v)] {
				return true
			}
		}
		return false
	}
	ready := func(n *ir.Node) bool {
		for _, v := range n.Ins {
			if pending[root(v)] {
				return false
			}
		}
		return true
	}
	out := make([]*ir.Node, 0, len(bwd))
	placed := map[*ir.Node]bool{}
	emit := func(n *ir.Node) {
		out = append(out, n)
		placed[n] = true
		for _, o := range n.Outs {
			delete(pending, o)
		}
	}
	for i, n := range bwd {
		if placed[n] {
			continue
		}
		if readsDropped(n) {
			for _, m := range bwd[i+1:] {
				if !placed[m] && !readsDropped(m) && ready(m) {
					emit(m)
				}
			}
		}
		emit(n)
	}
	return out
}

// trunkSequence is the trunk loop's order: the trunk's forward in loop 0,
// the head's forward and backward over the whole batch, then the trunk's
// backward in loop 1, recomputing the trunk forward it needs.
func (c *candidate) trunkSequence(a *analysis, fwd, bwd []*ir.Node) ([]*pstep, error) {
	var trunkF, headF, trunkB, headB []*ir.Node
	for _, n := range fwd {
		if c.inLoop(a, n) {
			trunkF = append(trunkF, n)
		} else {
			headF = append(headF, n)
		}
	}
	for _, n := range bwd {
		if c.inLoop(a, n) {
			trunkB = append(trunkB, n)
		} else {
			headB = append(headB, n)
		}
	}
	if len(trunkF) == 0 || len(headF) == 0 {
		return nil, fmt.Errorf("empty trunk or head")
	}
	seq := append(steps(trunkF, 0), steps(headF, -1)...)
	seq = append(seq, steps(headB, -1)...)
	seq = append(seq, withRecomputes(trunkB, trunkRecomputes(trunkF, trunkB, append(append([]*ir.Node{}, headF...), headB...)), trunkF, 1)...)
	first, last := layerName(trunkF[0]), layerName(trunkF[len(trunkF)-1])
	c.loops = []*ploop{
		{micro: c.d.micro, what: fmt.Sprintf("forward of %s..%s", first, last)},
		{micro: c.d.micro, what: fmt.Sprintf("backward of %s..%s, recomputing its forward", first, last)},
	}
	return seq, nil
}

// trunkRecomputes picks the trunk forward nodes the backward loop must
// recompute: those whose outputs the trunk's backward needs (directly or
// through another recomputed node) and the head does not read (what the
// head reads is kept whole-batch).
func trunkRecomputes(trunkF, trunkB, head []*ir.Node) map[int]bool {
	headReads := map[*ir.Value]bool{}
	for _, n := range head {
		for _, v := range n.Ins {
			headReads[root(v)] = true
		}
	}
	need := map[*ir.Value]bool{}
	for _, n := range trunkB {
		for _, v := range n.Ins {
			need[root(v)] = true
		}
	}
	rec := map[int]bool{}
	for i := len(trunkF) - 1; i >= 0; i-- {
		n := trunkF[i]
		needed, shared := false, false
		for _, o := range n.Outs {
			needed = needed || need[o]
			shared = shared || headReads[o]
		}
		if needed && !shared {
			rec[n.ID] = true
			for _, v := range n.Ins {
				need[root(v)] = true
			}
		}
	}
	return rec
}

// measureLoops sets each loop's extent in c.steps (which must be
// contiguous and non-empty) and its iteration count.
func (c *candidate) measureLoops(a *analysis) error {
	for li, l := range c.loops {
		l.first, l.last = -1, -1
		for i, s := range c.steps {
			if s.loop == li {
				if l.first < 0 {
					l.first = i
				}
				if l.last >= 0 && l.last != i-1 {
					return fmt.Errorf("loop %d is not contiguous", li)
				}
				l.last = i
			}
		}
		if l.first < 0 {
			return fmt.Errorf("loop %d is empty", li)
		}
		l.count = (a.batch + l.micro - 1) / l.micro
	}
	return nil
}

// graphOrder lists the planned graph's nodes in step order (each once,
// recomputations not again), views right after the node defining their
// input (keeping SSA order), and the updates last, in their phase.
func graphOrder(g *ir.Graph, seq []*pstep) []*ir.Node {
	var nodes []*ir.Node
	seen := map[*ir.Node]bool{}
	for _, s := range seq {
		if !s.recompute && s.node.Phase != ir.Update && !seen[s.node] {
			seen[s.node] = true
			nodes = append(nodes, s.node)
		}
	}
	var views []*ir.Node
	for _, n := range g.Nodes {
		if isView(n) {
			views = append(views, n)
		}
	}
	nodes = placeViews(nodes, views)
	for _, s := range seq {
		if s.node.Phase == ir.Update {
			nodes = append(nodes, s.node)
		}
	}
	return nodes
}

// placeViews inserts each view node right after the node defining its
// input (views of graph inputs go first).
func placeViews(nodes, views []*ir.Node) []*ir.Node {
	after := map[*ir.Node][]*ir.Node{}
	var first []*ir.Node
	for _, v := range views {
		if d := v.Ins[0].Def; d != nil {
			after[d] = append(after[d], v)
		} else {
			first = append(first, v)
		}
	}
	out := append([]*ir.Node{}, first...)
	var emit func(n *ir.Node)
	emit = func(n *ir.Node) {
		out = append(out, n)
		for _, v := range after[n] {
			emit(v)
		}
	}
	for _, v := range first {
		for _, w := range after[v] {
			emit(w)
		}
	}
	for _, n := range nodes {
		emit(n)
	}
	return out
}

// withRecomputes returns the steps of list with a recomputation of each
// dropped forward node (in forward order fwd) inserted before the first
// step that reads its outputs, directly or through another recomputation.
func withRecomputes(list []*ir.Node, drop map[int]bool, fwd []*ir.Node, loop int) []*pstep {
	first := map[*ir.Value]int{}
	for i, n := range list {
		for _, v := range n.Ins {
			r := root(v)
			if _, ok := first[r]; !ok {
				first[r] = i
			}
		}
	}
	const never = 1 << 30
	anchor := map[*ir.Node]int{}
	for i := len(fwd) - 1; i >= 0; i-- {
		f := fwd[i]
		if !drop[f.ID] {
			continue
		}
		at := never
		for _, o := range f.Outs {
			if j, ok := first[o]; ok {
				at = min(at, j)
			}
		}
		for g, j := range anchor {
			for _, v := range g.Ins {
				for _, o := range f.Outs {
					if root(v) == o {
						at = min(at, j)
					}
				}
			}
		}
		if at < never {
			anchor[f] = at
		}
	}
	var out []*pstep
	for i, n := range list {
		for _, f := range fwd {
			if j, ok := anchor[f]; ok && j == i {
				out = append(out, &pstep{node: f, recompute: true, loop: loop})
			}
		}
		out = append(out, &pstep{node: n, loop: loop})
	}
	return out
}

// insertUpdates places each node of the update phase (in graph order)
// right after the latest of its inputs' definitions (gradients, and what
// update-phase nodes placed before it computed: the clipping coefficient)
// and the last other step reading a parameter it updates, or after the
// loop those fall in.
func insertUpdates(seq []*pstep, upd []*ir.Node) []*pstep {
	def := map[*ir.Value]int{}
	lastRead := map[*ir.Value]int{}
	for i, s := range seq {
		for _, v := range s.node.Ins {
			lastRead[root(v)] = i
		}
		if !s.recompute {
			for _, v := range s.node.Outs {
				def[v] = i
			}
		}
	}
	after := map[int][]*ir.Node{}
	var front []*ir.Node
	for _, u := range upd {
		at := -1
		for _, v := range u.Ins {
			if i, ok := def[root(v)]; ok {
				at = max(at, i)
			}
		}
		for _, p := range u.UpdatedParams() {
			if i, ok := lastRead[p.Value]; ok {
				at = max(at, i)
			}
		}
		if at >= 0 && seq[at].loop >= 0 {
			l := seq[at].loop
			for at+1 < len(seq) && seq[at+1].loop == l {
				at++
			}
		}
		if at < 0 {
			front = append(front, u)
		} else {
			after[at] = append(after[at], u)
		}
		for _, v := range u.Outs {
			def[v] = at // what later update-phase nodes read comes after u
		}
	}
	var out []*pstep
	for _, u := range front {
		out = append(out, &pstep{node: u, loop: -1})
	}
	for i, s := range seq {
		out = append(out, s)
		for _, u := range after[i] {
			out = append(out, &pstep{node: u, loop: -1})
		}
	}
	return out
}

// walk resolves every operand to a value instance and checks the order:
// each value is defined before it is read, no parameter is read after its
// update, nothing in a loop updates a parameter or reads an accumulator.
func (c *candidate) walk(a *analysis) error {
	g := c.g
	cur := map[*ir.Value]*inst{}
	newInst := func(v *ir.Value, def int) *inst {
		i := &inst{v: v, def: def, lastRead: def, loop: -1}
		c.insts = append(c.insts, i)
		cur[v] = i
		return i
	}
	for _, v := range g.Inputs {
		newInst(v, -1)
	}
	for _, p := range g.Params {
		newInst(p.Value, -1).persistent = true
		for _, s := range p.State {
			newInst(s, -1).persistent = true
		}
	}
	for _, p := range g.Buffers {
		newInst(p.Value, -1).persistent = true
	}
	updated := map[*ir.Value]bool{}
	for i, s := range c.steps {
		n := s.node
		for _, v := range n.Ins {
			r := root(v)
			in := cur[r]
			if in == nil {
				return fmt.Errorf("%s reads %s before it is defined", n.Op, v)
			}
			if updated[r] {
				return fmt.Errorf("%s reads %s after its update", n.Op, v)
			}
			if s.loop >= 0 && in.accum {
				return fmt.Errorf("%s in a loop reads the accumulator %s", n.Op, v)
			}
			in.reads = append(in.reads, i)
			in.lastRead = i
			s.ins = append(s.ins, in)
		}
		if s.loop >= 0 && len(n.UpdatedParams()) > 0 {
			return fmt.Errorf("%s updates parameters inside a micro-batch loop", n.Op)
		}
		if s.loop >= 0 && n.Op.Info().BatchCoupled {
			return &coupledError{n}
		}
		for _, p := range n.UpdatedParams() {
			updated[p.Value] = true
		}
		for _, v := range n.Outs {
			o := newInst(v, i)
			o.recomputed = s.recompute
			if s.loop >= 0 && !v.Type.Batched {
				o.accum = true
				s.accumulate = true
			}
			s.outs = append(s.outs, o)
		}
	}
	// the host reads the loss and the correct count after the step (or
	// the logits, when no kernel counts)
	for _, in := range c.insts {
		if in.def >= 0 && hostReads(g, in.v) {
			in.keep = true
		}
	}
	// batch extent: a batched instance defined in a loop and read only
	// there lives one micro-batch at a time
	for _, in := range c.insts {
		if !in.v.Type.Batched {
			continue
		}
		in.samples = a.batch
		if in.def >= 0 && !in.keep {
			if l := c.steps[in.def].loop; l >= 0 {
				local := true
				for _, r := range in.reads {
					local = local && c.steps[r].loop == l
				}
				if local {
					in.loop, in.samples = l, c.loops[l].micro
				}
			}
		}
	}
	for _, in := range c.insts {
		in.cat = c.category(in)
	}
	return nil
}

func (c *candidate) category(in *inst) Category {
	switch in.v.Role {
	case ir.RoleParam:
		return CatParam
	case ir.RoleOptState:
		return CatState
	case ir.RoleBuffer:
		return CatBuffer
	case ir.RoleGrad:
		return CatGrad
	case ir.RoleInput, ir.RoleLabel:
		return CatInput
	case ir.RoleActivation:
		if in.def >= 0 && c.steps[in.def].node.Phase == ir.Update {
			return CatTransient // computed for the updates (the clipping coefficient)
		}
		if in.v.Type.DType == ir.Argmax {
			return CatArgmax
		}
		if in.recomputed || (in.lastRead >= 0 && phaseOf(c.steps[in.lastRead]) != ir.Forward) {
			return CatSaved
		}
	}
	return CatTransient
}

func phaseOf(s *pstep) ir.Phase {
	if s.recompute {
		return ir.Backward
	}
	return s.node.Phase
}

// inPlace lets a kernel's output take over an input's buffer where the op
// allows it (ir.Node.InPlaceInputs) and the input dies at that kernel.
func (c *candidate) inPlace() {
	for i, s := range c.steps {
		if len(s.outs) == 0 {
			continue
		}
		out := s.outs[0]
		for _, j := range s.node.InPlaceInputs() {
			in := s.ins[j]
			if in.def < 0 || in.persistent || in.keep || in.accum || out.accum || out.keep ||
				in.lastRead != i || in.next != nil || in.loop != out.loop || in.samples != out.samples ||
				in.bytes() != out.bytes() || in.v.Type.DType != out.v.Type.DType {
				continue
			}
			if s.loop >= 0 && in.loop != s.loop {
				continue // a whole-batch input read by every iteration
			}
			in.next, out.prev = out, in
			break
		}
	}
}

// buffers groups instances into buffers (an in-place chain shares one) and
// computes live ranges, extended over loops: a buffer read inside a loop
// but defined before it lives to the loop's end; one defined inside and
// read after it lives from the loop's start (every iteration writes its
// slice); accumulators live from the start (zeroed there).
func (c *candidate) buffers(a *analysis) {
	last := len(c.steps) - 1
	for _, in := range c.insts {
		if in.prev != nil {
			continue
		}
		b := &buffer{id: len(c.bufs), loop: in.loop, first: max(in.def, 0)}
		b.bytes = in.bytes()
		for x := in; x != nil; x = x.next {
			x.buf = b
			b.insts = append(b.insts, x)
			b.last = max(b.last, x.lastRead, x.def)
			if x.keep || x.persistent {
				b.last = last
			}
			if x.loop != b.loop {
				b.loop = -1
			}
		}
		if in.persistent {
			b.first = 0
		}
		for li, l := range c.loops {
			if b.loop == li {
				continue
			}
			if b.first < l.first && b.last >= l.first && b.last < l.last {
				b.last = l.last
			}
			if b.first >= l.first && b.first <= l.last {
				b.first = l.first
				b.last = max(b.last, l.last)
			}
		}
		c.bufs = append(c.bufs, b)
	}
	if a.dp != nil {
		c.pinBuckets(a)
		if a.dp.shard {
			c.shardState(a)
		}
	}
	c.workspaceBuffers(a)
	c.live = make([]int64, len(c.steps))
	shares := map[int]int64{}
	for _, b := range c.bufs {
		if b.owner > 0 { // persistent: live at every step
			shares[b.owner] += b.bytes
			continue
		}
		for s := b.first; s <= b.last; s++ {
			c.live[s] += b.bytes
		}
	}
	for s := range c.live {
		c.live[s] += maxShare(shares)
	}
	c.maxLive = 0
	for _, l := range c.live {
		c.maxLive = max(c.maxLive, l)
	}
	c.flops, c.extra = 0, 0
	for _, s := range c.steps {
		f := c.stepFLOPs(a, s)
		c.flops += f
		if s.recompute {
			c.extra += f
		}
	}
}

// workspaceBuffers adds, for each step whose kernels need scratch memory,
// a buffer live during that step alone: placement can put it in any gap.
func (c *candidate) workspaceBuffers(a *analysis) {
	if a.workspace == nil {
		return
	}
	for i, s := range c.steps {
		samples := a.batch
		if s.loop >= 0 {
			samples = c.loops[s.loop].micro
		}
		bytes := a.workspace(s.node, samples)
		if bytes <= 0 {
			continue
		}
		v := &ir.Value{Name: fmt.Sprintf("workspace of step %d (%s %s)", i, s.node.Op, s.node.Name), Type: ir.F32Fixed((bytes + 3) / 4), Pos: s.node.Pos}
		in := &inst{v: v, def: i, lastRead: i, loop: s.loop, cat: CatWorkspace}
		b := &buffer{id: len(c.bufs), insts: []*inst{in}, bytes: in.bytes(), first: i, last: i, loop: s.loop}
		in.buf = b
		c.bufs = append(c.bufs, b)
	}
}

// stepFLOPs counts a step over all its loop iterations.
func (c *candidate) stepFLOPs(a *analysis, s *pstep) int64 {
	batched := false
	for _, v := range s.node.Ins {
		batched = batched || v.Type.Batched
	}
	if s.loop >= 0 && !batched {
		return s.node.FLOPs(1) * c.loops[s.loop].count
	}
	return s.node.FLOPs(a.batch)
}

// hostReads says whether the host reads v after the step: the loss and the
// correct count (or the logits, when no kernel counts), not the
// gradients the loss kernel writes nor the classifier tail's logits; an
// inference graph's logits.
func hostReads(g *ir.Graph, v *ir.Value) bool {
	if g.Infer {
		return v == g.Logits
	}
	lossNode := g.Loss.Def
	if v.Def == lossNode && v == g.Logits {
		return false // the classifier tail's logits: its kernel counts the correct ones
	}
	return v == g.Loss || (v.Def == lossNode && v.Role != ir.RoleActGrad && v.Role != ir.RoleGrad) || (len(lossNode.Outs) == 1 && v == g.Logits)
}
