package plan

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/units"
)

// DefaultAlignment is the offset alignment of every buffer: what
// cudaMalloc guarantees, so vector loads work at any buffer's start.
const DefaultAlignment = 256

// Config says what to plan for.
type Config struct {
	Batch int64
	// Budget in bytes; 0 means none (the plan then only minimises the peak,
	// recomputing memory-bound values from saved ones, and compute-bound
	// ones within 1/20 of the step's FLOPs (cheap.go), no micro-batching).
	Budget int64
	// BudgetPos is where the budget is written in the model (the value of
	// the train block's memory_budget); the error for a budget no plan
	// meets points there. Zero when the budget came from elsewhere, and
	// BudgetSource then names it (e.g. "--memory-budget").
	BudgetPos    dsl.Pos
	BudgetSource string
	// NoRecompute and NoMicroBatch rule strategies out (cnnc plan
	// --max-batch compares them).
	NoRecompute, NoMicroBatch bool
	// MicroBatch > 0 skips the search and micro-batches with that many
	// samples: the trunk of layers up to Trunk (a forward layer before the
	// loss), or the whole step when Trunk is empty.
	MicroBatch int64
	Trunk      string
	// Accumulate > 1 is gradient accumulation (the train block's
	// accumulate): Batch is the update's samples, a multiple of Accumulate,
	// and the whole step runs in Accumulate micro-batches of
	// Batch/Accumulate (MicroBatch and Trunk must then be unset).
	Accumulate int64
	// Alignment of buffer offsets (0: DefaultAlignment).
	Alignment int64
	// Workspace gives the scratch bytes a node's kernels need while it runs
	// (split-K partial sums) for a launch over samples; the plan places a
	// workspace buffer live only during that step. Nil: no kernel needs any
	// (package driver gives the code generator's for the target).
	Workspace func(n *ir.Node, samples int64) int64
	// Ranks > 1 plans one rank of data-parallel training on Ranks devices
	// (parallel.go): Batch is then the global batch, of which each rank
	// takes Batch/Ranks samples (Accumulate applies to the rank's share),
	// and the plan gets gradient buckets of BucketBytes (the first
	// FirstBucketBytes; 0: PyTorch's defaults) and Plan.DataParallel.
	Ranks                         int
	BucketBytes, FirstBucketBytes int64
	// ShardOptimizer (Ranks > 1): each rank keeps the optimizer state of
	// its share of the parameters only (DataParallel.Shard).
	ShardOptimizer bool
	// DataParallel with Ranks 1 plans the data-parallel step of one rank
	// all the same (buckets, split updates, the all-reduces NCCL runs over
	// one rank): the job that measures what the NCCL path costs on one GPU.
	DataParallel bool
	// Updates says how the split of fused optimizer updates out of their
	// weight-gradient kernels is chosen (UpdatePolicy); the zero value is
	// the planner's memory-first choice.
	Updates UpdatePolicy
}

// UpdatePolicy is how the planner chooses which fused updates to split out
// of their weight-gradient kernels. Splitting buys an input gradient
// written in place over the saved input (less memory) for a separate
// update launch (more time); the planner itself has no time model, so
// driver.Alternatives offers the performance model both policies' plans
// under a budget and it picks the fastest (perf.Fastest).
type UpdatePolicy uint8

const (
	// UpdatesMemoryFirst splits wherever that lowers the arena (ties: fewer
	// splits): the plan of the smallest peak over the split choices.
	UpdatesMemoryFirst UpdatePolicy = iota
	// UpdatesFusedFirst, under a budget, prefers among the split choices
	// that meet it the fewest splits (ties: the smaller arena): updates
	// stay fused in their weight-gradient kernels while the budget allows.
	// Split choices that miss the budget rank as memory-first, so when
	// no split choice alone meets it the search goes on exactly as
	// memory-first (recomputation, micro-batching), and the plan it finds
	// then fuses the updates the budget still allows. Without a budget it
	// is memory-first.
	UpdatesFusedFirst
	// UpdatesMinMemory plans as memory-first and tells driver.Alternatives
	// to offer no fused-first plan (cnnc plan/build --min-memory): the
	// minimal-memory plan even when a GPU's model would choose.
	UpdatesMinMemory
)

// BudgetError says that no plan meets the budget, and what budget would.
type BudgetError struct {
	Model   string
	Batch   int64
	Budget  int64
	Min     int64  // the smallest arena of any plan found: a budget that works
	MinHow  string // how that plan gets there
	Pos     dsl.Pos
	Source  string
	Tactics string // what was tried
	// Persistent is what the parameters and optimizer state occupy, whatever
	// the batch: a budget below it cannot be met by a smaller batch.
	Persistent int64
	// Coupled is the first batch-coupled layer (batch norm), which no
	// micro-batch loop may cross, and where it is; nil when there is none.
	Coupled *ir.Node
	// Accumulate > 1: the train block's accumulate fixed the micro-batch
	// (Batch is the update's samples).
	Accumulate int64
}

func (e *BudgetError) Error() string { return e.Diagnostic().Error() }

// Diagnostic is the error at the budget's position in the model.
func (e *BudgetError) Diagnostic() *dsl.Diagnostic {
	what := "memory_budget"
	if e.Source != "" {
		what = e.Source
	}
	if e.Budget < e.Persistent {
		d := dsl.Errorf(e.Pos, "%s %s is too small for %s: its parameters and optimizer state alone need %s (%s), at any batch",
			what, units.FormatBytes(e.Budget), e.Model, units.FormatBytes(e.Persistent), commas(e.Persistent))
		d.Hint("the smallest plan at %s needs %s (%s, %s): a budget of %s or more works; a smaller batch does not help",
			e.batchWords(), commas(e.Min), units.FormatBytes(e.Min), e.MinHow, roundUpSize(e.Min))
		return d
	}
	d := dsl.Errorf(e.Pos, "%s %s is too small for %s at %s: the smallest plan needs %s (%s, %s)",
		what, units.FormatBytes(e.Budget), e.Model, e.batchWords(), commas(e.Min), units.FormatBytes(e.Min), e.MinHow)
	d.Hint("tried: %s", e.Tactics)
	if e.Accumulate > 1 {
		return d.Hint("a budget of %s or more works, or lower the batch and raise accumulate (the same samples per update in smaller micro-batches)", roundUpSize(e.Min))
	}
	if n := e.Coupled; n != nil {
		d.Hint("micro-batches cannot cross %s (%s at %s): its statistics are the whole batch's, so only the layers before it may run in micro-batches",
			n.Name, n.Op, n.Pos)
	}
	d.Hint("a budget of %s or more works, or lower the batch (cnnc plan --max-batch tells how far)", roundUpSize(e.Min))
	return d
}

// batchWords is the batch planned for: "batch 32", "accumulate = 4
// batches of 32".
func (e *BudgetError) batchWords() string {
	if e.Accumulate > 1 {
		return fmt.Sprintf("accumulate = %d batches of %d", e.Accumulate, e.Batch/e.Accumulate)
	}
	return fmt.Sprintf("batch %d", e.Batch)
}

// roundUpSize prints n bytes rounded up, in the decimal unit that fits
// (as units.FormatBytes picks it), as a size the DSL and --memory-budget
// read: "38.74MB", "512B".
func roundUpSize(n int64) string {
	if n < 1000 {
		return fmt.Sprintf("%dB", n)
	}
	unit, name := int64(1000), "KB"
	for _, u := range []struct {
		v    int64
		name string
	}{{1e6, "MB"}, {1e9, "GB"}, {1e12, "TB"}} {
		if n >= u.v-u.v/100000/2 { // as FormatBytes: 999,999,999 B is 1.00 GB
			unit, name = u.v, u.name
		}
	}
	hundredth := unit / 100
	k := (n + hundredth - 1) / hundredth
	return fmt.Sprintf("%d.%02d%s", k/100, k%100, name)
}

// Build plans one training step of g for cfg. g must be a verified
// training graph (normally the output of the fuse pass); it is not
// modified — the plan's steps run on Plan.Graph, a rewritten copy.
// When a budget is set and no plan meets it even with micro-batches of
// one sample, the error is a *BudgetError naming the smallest budget that
// works.
func Build(g *ir.Graph, cfg Config) (*Plan, error) {
	a, c, strategy, err := search(g, cfg)
	if err != nil {
		return nil, err
	}
	return a.materialize(c, cfg, strategy)
}

// search finds the plan Build returns, before it becomes a Plan.
func search(g *ir.Graph, cfg Config) (*analysis, *candidate, string, error) {
	if cfg.Batch < 1 || cfg.Batch > compiler.MaxBatch {
		return nil, nil, "", fmt.Errorf("plan: the batch must be between 1 and %s, got %s", compiler.Commas(compiler.MaxBatch), compiler.Commas(cfg.Batch))
	}
	if cfg.Alignment == 0 {
		cfg.Alignment = DefaultAlignment
	}
	dp, batch, err := rankConfig(g, cfg)
	if err != nil {
		return nil, nil, "", err
	}
	cfg.Batch = batch
	a, err := analyze(g, cfg.Batch, cfg.Alignment)
	if err != nil {
		return nil, nil, "", err
	}
	a.budget = max(cfg.Budget, 0)
	a.fusedFirst = cfg.Updates == UpdatesFusedFirst && a.budget > 0
	a.workspace = cfg.Workspace
	a.dp = dp
	if cfg.Accumulate > 1 {
		if cfg.MicroBatch > 0 || cfg.Trunk != "" {
			return nil, nil, "", fmt.Errorf("plan: accumulate = %d fixes the micro-batch; a forced micro-batch or trunk cannot be given too", cfg.Accumulate)
		}
		if cfg.Batch%cfg.Accumulate != 0 {
			return nil, nil, "", fmt.Errorf("plan: the update's batch %d is not a multiple of accumulate = %d", cfg.Batch, cfg.Accumulate)
		}
		cfg.MicroBatch = cfg.Batch / cfg.Accumulate
	}
	base, err := a.bestSplits(decisions{split: map[int]bool{}, drop: map[int]bool{}})
	if err != nil {
		return nil, nil, "", err
	}
	if cfg.MicroBatch > 0 {
		c, err := a.forced(base.d, cfg)
		if err != nil {
			return nil, nil, "", err
		}
		if cfg.Accumulate > 1 {
			return a, c, "accumulate", nil
		}
		return a, c, "micro-batch", nil
	}
	if cfg.Budget > 0 && base.arena <= cfg.Budget {
		return a, base, "fits", nil
	}
	frugal := []*candidate{base}
	tactics := []string{"minimising the peak (" + mb(base.arena) + ")"}
	if !cfg.NoRecompute {
		// memory-bound values saved beside their inputs (cheap.go): the
		// smallest peak without a budget, the first resort with one
		cheap := a.cheapRecompute(base)
		switch {
		case cfg.Budget <= 0:
			return a, cheap, "fits", nil
		case cheap.arena <= cfg.Budget:
			return a, cheap, "recompute", nil
		}
		frugal = append(frugal, cheap)
		tactics = append(tactics, "recomputing memory-bound layers ("+mb(cheap.arena)+")")
	} else if cfg.Budget <= 0 {
		return a, base, "fits", nil
	}
	if !cfg.NoRecompute {
		fit, most := a.recompute(base.d, cfg.Budget)
		if fit != nil {
			return a, a.descend(fit), "recompute", nil
		}
		if most != nil {
			// and the memory-bound layers the convs' recomputation keeps
			if c := a.cheapRecompute(most); c.arena < most.arena {
				if c.arena <= cfg.Budget {
					return a, c, "recompute", nil
				}
				most = c
			}
			frugal = append(frugal, most)
			tactics = append(tactics, "recomputation ("+mb(most.arena)+" at best)")
		}
	}
	if !cfg.NoMicroBatch && cfg.Batch > 1 {
		fit, ones := a.microBatch(base.d, cfg.Budget)
		if fit != nil {
			return a, a.descend(fit), "micro-batch", nil
		}
		frugal = append(frugal, ones...)
		if len(ones) > 0 {
			tactics = append(tactics, "micro-batches of one sample through the trunk or the whole step")
		}
	}
	// the smallest budget that works is the careful placement's arena
	// (deterministic: planning for that budget finds it again)
	least := frugal[0]
	for _, c := range frugal {
		if c.arena > c.maxLive {
			c.arena = place(c.bufs, a.align, placeEffort)
		}
		if c.arena < least.arena {
			least = c
		}
	}
	return nil, nil, "", &BudgetError{Model: g.Name, Batch: cfg.Batch, Budget: cfg.Budget, Min: least.arena, MinHow: a.describe(least),
		Pos: cfg.BudgetPos, Source: cfg.BudgetSource, Tactics: strings.Join(tactics, "; "), Persistent: persistentBytes(g, cfg.Alignment),
		Coupled: a.firstCoupled()}
}

// persistentBytes is what parameters and optimizer state take in the
// arena (each buffer aligned): the part of any plan no batch changes.
func persistentBytes(g *ir.Graph, align int64) int64 {
	var n int64
	for _, p := range g.Params {
		n += alignUp(p.Value.Type.Bytes(1), align)
		for _, s := range p.State {
			n += alignUp(s.Type.Bytes(1), align)
		}
	}
	for _, p := range g.Buffers {
		n += alignUp(p.Value.Type.Bytes(1), align)
	}
	return n
}

// forced builds the micro-batched plan cfg asks for.
func (a *analysis) forced(base decisions, cfg Config) (*candidate, error) {
	d := base.clone()
	d.loop, d.micro = stepLoop, cfg.MicroBatch
	if cfg.MicroBatch > a.batch {
		return nil, fmt.Errorf("plan: micro-batch %d is larger than the batch %d", cfg.MicroBatch, a.batch)
	}
	if cfg.Trunk != "" {
		d.loop, d.cut = trunkLoop, -1
		var names []string
		for i, n := range a.fwd[:max(a.loss, 0)] {
			names = append(names, layerName(n))
			if layerName(n) == cfg.Trunk {
				d.cut = i
			}
		}
		if d.cut < 0 {
			return nil, fmt.Errorf("plan: no layer %q before the loss to end the micro-batched trunk (layers: %s)", cfg.Trunk, strings.Join(names, ", "))
		}
	}
	c, err := a.evaluate(d)
	if err != nil {
		var ce *coupledError
		if errors.As(err, &ce) {
			n := ce.n
			return nil, fmt.Errorf("plan: cannot micro-batch that way: %s (%s at %s) computes statistics over the whole batch; only the layers before it may run in micro-batches", n.Name, n.Op, n.Pos)
		}
		return nil, fmt.Errorf("plan: cannot micro-batch that way: %v", err)
	}
	c = a.descend(c)
	if a.budget > 0 && c.arena > a.budget && c.arena > c.maxLive {
		c.arena = place(c.bufs, a.align, placeEffort)
	}
	if a.budget > 0 && c.arena > a.budget {
		if cfg.Accumulate > 1 {
			// the train block fixed the micro-batch: an error at the budget,
			// as for any plan that misses it
			return nil, &BudgetError{Model: a.g.Name, Batch: a.batch, Budget: a.budget, Min: c.arena, MinHow: a.describe(c),
				Pos: cfg.BudgetPos, Source: cfg.BudgetSource, Persistent: persistentBytes(a.g, a.align), Accumulate: cfg.Accumulate,
				Tactics: fmt.Sprintf("accumulate = %d fixes the step: micro-batches of %d, no recomputation", cfg.Accumulate, cfg.MicroBatch)}
		}
		return nil, fmt.Errorf("plan: micro-batches of %d need %s, over the budget of %s", cfg.MicroBatch, mb(c.arena), mb(a.budget))
	}
	return c, nil
}

// describe says in a few words how a candidate saves memory.
func (a *analysis) describe(c *candidate) string {
	var parts []string
	switch c.d.loop {
	case stepLoop:
		parts = append(parts, fmt.Sprintf("the whole step in micro-batches of %d", c.d.micro))
	case trunkLoop:
		parts = append(parts, fmt.Sprintf("%s..%s in micro-batches of %d", layerName(a.fwd[0]), layerName(a.fwd[c.d.cut]), c.d.micro))
	}
	if n := len(c.d.drop); n > 0 {
		parts = append(parts, fmt.Sprintf("recomputing %d layer(s)", n))
	}
	if len(parts) == 0 {
		return "no recomputation, no micro-batching"
	}
	return strings.Join(parts, ", ")
}

// better orders candidates by arena, then fewer split updates (a fused
// update saves a kernel and a gradient buffer's traffic). Fused-first
// (UpdatePolicy) puts the candidates that meet the budget first and orders
// those by fewer split updates, then arena.
func (a *analysis) better(x, y *candidate) bool {
	if a.fusedFirst {
		xFits, yFits := x.arena <= a.budget, y.arena <= a.budget
		if xFits != yFits {
			return xFits
		}
		if xFits && len(x.split) != len(y.split) {
			return len(x.split) < len(y.split)
		}
	}
	if x.arena != y.arena {
		return x.arena < y.arena
	}
	return len(x.split) < len(y.split)
}

// bestSplits chooses, layer by layer, whether to split each fused update
// (greedy descent on the arena — fused-first: on the splits while within
// the budget — starting from d's choice): splitting pays for a gradient
// buffer of the layer's parameters and buys an input gradient written in
// place over the saved input, for a separate update launch.
func (a *analysis) bestSplits(d decisions) (*candidate, error) {
	cur, err := a.evaluate(d)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return a.descend(cur), nil
}

// descend toggles one layer's split at a time, keeping each toggle that
// gives a better candidate, for at most four rounds (a round with no gain
// ends it): at most 4 x len(fusedUpdates) candidates evaluated.
func (a *analysis) descend(cur *candidate) *candidate {
	if a.dp != nil {
		return cur // data parallelism splits every update
	}
	for round := 0; round < 4; round++ {
		improved := false
		for _, w := range a.fusedUpdates {
			if _, ok := a.partner[w.ID]; !ok {
				continue // no input gradient to write in place
			}
			d := cur.d.clone()
			d.split[w.ID] = !d.split[w.ID]
			if !d.split[w.ID] {
				delete(d.split, w.ID)
			}
			c, err := a.evaluate(d)
			if err == nil && a.better(c, cur) {
				cur, improved = c, true
			}
		}
		if !improved {
			break
		}
	}
	return cur
}

// droppable lists the units recomputation may drop: their inputs are
// graph inputs, parameters or other units' outputs, so recomputing them
// never extends a forward-only value's life into the backward pass.
func (a *analysis) droppable() []int {
	isUnitOut := map[*ir.Value]bool{}
	for _, u := range a.units {
		for _, o := range a.fwd[u].Outs {
			isUnitOut[o] = true
		}
	}
	var out []int
	for _, u := range a.units {
		// a node that writes buffers (batch norm's statistics) would write
		// them again: never recomputed
		ok := len(a.fwd[u].MutatedInputs()) == 0
		for _, v := range a.fwd[u].Ins {
			r := root(v)
			ok = ok && (r.Def == nil || isUnitOut[r])
		}
		if ok {
			out = append(out, u)
		}
	}
	return out
}

// recompute chooses saved activations to drop so the plan fits the
// budget with the fewest extra FLOPs: exactly over a chain (dynamic
// programming), greedily over other DAGs. It returns the fitting plan (or
// nil) and the recomputing plan with the smallest arena it found (for the
// error that names the smallest budget).
func (a *analysis) recompute(base decisions, budget int64) (fit, most *candidate) {
	drops := a.droppable()
	if len(drops) == 0 {
		return nil, nil
	}
	keepSmaller := func(c *candidate) {
		if c == nil {
			return
		}
		if c.arena > c.maxLive {
			c.arena = place(c.bufs, a.align, placeEffort)
		}
		if most == nil || c.arena < most.arena {
			most = c
		}
	}
	all := base.clone()
	for _, u := range drops {
		all.drop[a.fwd[u].ID] = true
	}
	if c, err := a.evaluate(all); err == nil {
		keepSmaller(c)
	}
	c0, err := a.evaluate(base)
	if err != nil {
		return nil, most
	}
	if _, chain := a.chainAttribution(c0); chain {
		t := a.chainTable(base)
		target := budget
		for try := 0; try < 4; try++ {
			d, ok := t.solve(target)
			if !ok {
				break
			}
			c, err := a.evaluate(d)
			if err != nil {
				break
			}
			if c.arena <= budget {
				return c, most
			}
			// the programme bounds live bytes; alignment and placement
			// gaps add a little: ask for that much less
			target = min(target, c.maxLive) - (c.arena - budget)
		}
		// the fewest live bytes any recomputation reaches (bisection on
		// the programme's budget)
		lo, hi := int64(0), c0.maxLive
		for lo < hi {
			mid := lo + (hi-lo)/2
			if _, ok := t.solve(mid); ok {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		if d, ok := t.solve(lo); ok {
			if c, err := a.evaluate(d); err == nil {
				keepSmaller(c)
			}
		}
	} else {
		c, fits := a.greedyDrops(base, budget, drops)
		if fits {
			return c, most
		}
		keepSmaller(c)
	}
	if most != nil && most.arena <= budget {
		return most, most
	}
	return nil, most
}

// unitOf maps a forward index to its 1-based position among the units:
// the first unit at or after it (len(units)+1 after the last).
func (a *analysis) unitOf(fwdIndex int) int {
	for k, u := range a.units {
		if u >= fwdIndex {
			return k + 1
		}
	}
	return len(a.units) + 1
}

// stepUnit attributes a step to a unit: its forward node's.
func (a *analysis) stepUnit(s *pstep) int {
	o := a.ownerOf(s.node)
	if o < 0 {
		return -1
	}
	return a.unitOf(o)
}

// chainAttribution checks that c0's steps form a chain over the units:
// every step reads saved outputs only of its own unit and the one before.
// Then the live bytes at any step attributed to units k+1..m, when units k
// and m are kept and those between dropped, are the kept units' bytes
// before k plus terms that depend on that segment alone — what makes the
// dynamic programme below exact.
func (a *analysis) chainAttribution(c0 *candidate) ([]int, bool) {
	unitOfOut := map[int]int{} // value ID (clones keep IDs) -> unit
	for k, u := range a.units {
		for _, o := range a.fwd[u].Outs {
			unitOfOut[o.ID] = k + 1
		}
	}
	attr := make([]int, len(c0.steps))
	for i, s := range c0.steps {
		t := a.stepUnit(s)
		if t < 0 {
			return nil, false
		}
		attr[i] = t
		for _, in := range s.ins {
			if j, ok := unitOfOut[in.v.ID]; ok && (j < t-1 || j > t) {
				return nil, false
			}
		}
	}
	return attr, true
}

// chainDP is optimal checkpointing over the chain of units under the
// single-recomputation model: dropped units between two kept ones k < m
// are recomputed once, from k, just before the backward pass needs them.
// local(k,m) — the most bytes live during segment (k,m] beyond the kept
// units before k — is measured on the candidate that keeps every unit but
// k+1..m-1 (chainTable); solve keeps, per kept unit, the Pareto front of
// (bytes kept before it, extra FLOPs) and returns the cheapest path that
// keeps every segment within the budget.
func (a *analysis) chainDP(base decisions, budget int64) (decisions, bool) {
	return a.chainTable(base).solve(budget)
}

// dpTable holds what the programme needs; it does not depend on the budget.
type dpTable struct {
	a            *analysis
	base         decisions
	n            int
	saved, flops []int64
	local        [][]int64
}

const dpInf = int64(math.MaxInt64 / 4)

func (a *analysis) chainTable(base decisions) *dpTable {
	n := len(a.units)
	droppable := map[int]bool{}
	for _, u := range a.droppable() {
		droppable[u] = true
	}
	t := &dpTable{a: a, base: base, n: n, saved: make([]int64, n+2), flops: make([]int64, n+2), local: make([][]int64, n+2)}
	for k, u := range a.units {
		t.saved[k+1] = a.saved[u]
		t.flops[k+1] = a.fwd[u].FLOPs(a.batch)
	}
	for k := 0; k <= n; k++ {
		t.local[k] = make([]int64, n+2)
		for m := k + 1; m <= n+1; m++ {
			t.local[k][m] = dpInf
			d := base.clone()
			ok := true
			for j := k + 1; j < m; j++ {
				ok = ok && droppable[a.units[j-1]]
				d.drop[a.fwd[a.units[j-1]].ID] = true
			}
			if !ok {
				continue
			}
			c, err := a.evaluate(d)
			if err != nil {
				continue
			}
			var prefix int64
			for j := 1; j < k; j++ {
				prefix += t.saved[j]
			}
			worst := int64(0)
			for i, s := range c.steps {
				if u := a.stepUnit(s); u > k && u <= m {
					worst = max(worst, c.live[i]-prefix)
				}
			}
			t.local[k][m] = worst
		}
	}
	return t
}

func (t *dpTable) solve(budget int64) (decisions, bool) {
	n := t.n
	fronts := make([][]*dpState, n+2)
	fronts[0] = []*dpState{{from: -1}}
	for m := 1; m <= n+1; m++ {
		var cands []*dpState
		for k := 0; k < m; k++ {
			if t.local[k][m] >= dpInf {
				continue
			}
			var between int64
			for j := k + 1; j < m; j++ {
				between += t.flops[j]
			}
			for _, s := range fronts[k] {
				if s.kept+t.local[k][m] > budget {
					continue
				}
				cands = append(cands, &dpState{kept: s.kept + t.saved[k], extra: s.extra + between, from: k, prev: s})
			}
		}
		fronts[m] = pareto(cands)
	}
	if len(fronts[n+1]) == 0 {
		return decisions{}, false
	}
	best := fronts[n+1][0]
	for _, s := range fronts[n+1] {
		if s.extra < best.extra {
			best = s
		}
	}
	d := t.base.clone()
	for m, s := n+1, best; s != nil && s.from >= 0; m, s = s.from, s.prev {
		for j := s.from + 1; j < m; j++ {
			d.drop[t.a.fwd[t.a.units[j-1]].ID] = true
		}
	}
	return d, true
}

// dpState is a path of chainDP ending at a kept unit: the bytes kept
// before that unit and the FLOPs recomputed so far.
type dpState struct {
	kept, extra int64
	from        int // the previous kept unit (-1 at the start)
	prev        *dpState
}

// pareto keeps the states no other beats on both bytes kept and FLOPs.
func pareto(xs []*dpState) []*dpState {
	sort.SliceStable(xs, func(i, j int) bool {
		if xs[i].kept != xs[j].kept {
			return xs[i].kept < xs[j].kept
		}
		return xs[i].extra < xs[j].extra
	})
	var out []*dpState
	for _, x := range xs {
		if len(out) == 0 || x.extra < out[len(out)-1].extra {
			out = append(out, x)
		}
	}
	return out
}

// greedyDrops is the heuristic for DAGs that are not chains: repeatedly
// drop the unit that lowers the arena most per recomputed FLOP until the
// plan fits, then undo drops that turn out unnecessary (most expensive
// first). When nothing fits it returns the smallest plan it reached.
func (a *analysis) greedyDrops(base decisions, budget int64, units []int) (*candidate, bool) {
	cur, err := a.evaluate(base)
	if err != nil {
		return nil, false
	}
	for cur.arena > budget {
		var best *candidate
		bestScore := -1.0
		for _, u := range units {
			id := a.fwd[u].ID
			if cur.d.drop[id] {
				continue
			}
			d := cur.d.clone()
			d.drop[id] = true
			c, err := a.evaluate(d)
			// progress is a smaller arena, or at least fewer bytes live at
			// the peak (a plateau two drops may cross together)
			if err != nil || c.arena > cur.arena || (c.arena == cur.arena && c.maxLive >= cur.maxLive) {
				continue
			}
			gain := float64(cur.arena-c.arena) + 1e-3*float64(cur.maxLive-c.maxLive)
			score := gain / float64(a.fwd[u].FLOPs(a.batch)+1)
			if score > bestScore {
				best, bestScore = c, score
			}
		}
		if best == nil {
			return cur, false
		}
		cur = best
	}
	dropped := []int{}
	for _, u := range units {
		if cur.d.drop[a.fwd[u].ID] {
			dropped = append(dropped, u)
		}
	}
	sort.SliceStable(dropped, func(i, j int) bool {
		return a.fwd[dropped[i]].FLOPs(a.batch) > a.fwd[dropped[j]].FLOPs(a.batch)
	})
	for _, u := range dropped {
		d := cur.d.clone()
		delete(d.drop, a.fwd[u].ID)
		if c, err := a.evaluate(d); err == nil && c.arena <= budget {
			cur = c
		}
	}
	return cur, true
}

// microBatch tries each way of micro-batching — the trunk up to each
// forward node before the loss, and the whole step — with the largest
// micro-batch that fits (binary search; the peak grows with it). It
// returns the best fitting plan (largest micro-batch, then fewest extra
// FLOPs, then smallest arena), or nil and the plans at micro-batch 1.
func (a *analysis) microBatch(base decisions, budget int64) (*candidate, []*candidate) {
	var kinds []decisions
	for cut := 0; cut < a.loss; cut++ {
		d := base.clone()
		d.loop, d.cut = trunkLoop, cut
		kinds = append(kinds, d)
	}
	d := base.clone()
	d.loop = stepLoop
	kinds = append(kinds, d)
	var best *candidate
	var ones []*candidate
	for _, k := range kinds {
		at := func(m int64) (*candidate, bool) {
			d := k.clone()
			d.micro = m
			c, err := a.evaluate(d)
			if err != nil {
				return nil, false
			}
			return c, c.arena <= budget
		}
		c1, ok := at(1)
		if c1 == nil {
			continue
		}
		if !ok {
			ones = append(ones, c1)
			continue
		}
		lo, hi, fit := int64(1), a.batch-1, c1
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if c, ok := at(mid); ok {
				lo, fit = mid, c
			} else {
				hi = mid - 1
			}
		}
		if best == nil || fit.d.micro > best.d.micro ||
			(fit.d.micro == best.d.micro && (fit.extra < best.extra || (fit.extra == best.extra && fit.arena < best.arena))) {
			best = fit
		}
	}
	return best, ones
}

// mb prints bytes in the decimal unit that fits, as PyTorch and
// nvidia-smi count (units.FormatBytes).
func mb(n int64) string { return units.FormatBytes(n) }

// commas prints bytes with thousands separators and a unit: "14,771,624 B".
func commas(n int64) string { return compiler.Commas(n) + " B" }
