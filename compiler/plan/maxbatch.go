package plan

import (
	"errors"
	"fmt"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
)

// MaxBatch answers the question a reader of a memory guide asks: what is
// the largest batch that trains within this budget?
type MaxBatch struct {
	BudgetBytes int64 `json:"budget_bytes"`
	// Plain allows neither recomputation nor micro-batching (in-place
	// reuse and split updates only); Recompute adds recomputation;
	// MicroBatch adds micro-batching too.
	Plain      MaxBatchEntry `json:"no_recompute"`
	Recompute  MaxBatchEntry `json:"recompute"`
	MicroBatch MaxBatchEntry `json:"micro_batch"`
	// Limit is the largest batch tried.
	Limit int64 `json:"limit"`
}

// MaxBatchEntry is the largest batch one strategy reaches (0: not even
// one sample) and its plan's peak.
type MaxBatchEntry struct {
	Batch      int64  `json:"batch"`
	PeakBytes  int64  `json:"peak_bytes"`
	MicroBatch int64  `json:"micro_batch"`
	Strategy   string `json:"strategy"`
	How        string `json:"how"`
}

// DefaultMaxBatchLimit bounds FindMaxBatch's search: the largest batch
// cnnc compiles for (compiler.MaxBatch, about a million samples).
const DefaultMaxBatchLimit = compiler.MaxBatch

// FindMaxBatch finds, per strategy, the largest batch up to limit whose
// plan fits the budget: doubling, then bisection (a larger batch never
// needs less memory). limit <= 0 (or above DefaultMaxBatchLimit) means
// DefaultMaxBatchLimit; a model's own limit is compiler.Result.BatchLimit.
func FindMaxBatch(g *ir.Graph, budget, limit int64, workspace func(n *ir.Node, samples int64) int64) (*MaxBatch, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("plan: the largest batch needs a memory budget")
	}
	if limit <= 0 || limit > DefaultMaxBatchLimit {
		limit = DefaultMaxBatchLimit
	}
	out := &MaxBatch{BudgetBytes: budget, Limit: limit}
	for _, s := range []struct {
		e     *MaxBatchEntry
		cfg   Config
		label string
	}{
		{&out.Plain, Config{Budget: budget, NoRecompute: true, NoMicroBatch: true}, "no recomputation"},
		{&out.Recompute, Config{Budget: budget, NoMicroBatch: true}, "recomputation"},
		{&out.MicroBatch, Config{Budget: budget}, "micro-batching"},
	} {
		fits := func(b int64) (*analysis, *candidate, string, error) {
			cfg := s.cfg
			cfg.Batch, cfg.Workspace = b, workspace
			a, c, strategy, err := search(g, cfg)
			var be *BudgetError
			if errors.As(err, &be) {
				return nil, nil, "", nil
			}
			return a, c, strategy, err
		}
		record := func(b int64, a *analysis, c *candidate, strategy string) {
			*s.e = MaxBatchEntry{Batch: b, PeakBytes: c.arena, MicroBatch: b, Strategy: strategy, How: a.describe(c)}
			if c.d.loop != noLoop {
				s.e.MicroBatch = c.d.micro
			}
		}
		a, c, strategy, err := fits(1)
		if err != nil {
			return nil, err
		}
		if c == nil {
			continue
		}
		record(1, a, c, strategy)
		lo, hi := int64(1), int64(0) // lo fits; hi (when > 0) does not
		for hi == 0 && lo < limit {
			next := min(2*lo, limit)
			a, c, strategy, err := fits(next)
			if err != nil {
				return nil, err
			}
			if c == nil {
				hi = next
				break
			}
			lo = next
			record(lo, a, c, strategy)
		}
		for hi > lo+1 {
			mid := lo + (hi-lo)/2
			a, c, strategy, err := fits(mid)
			if err != nil {
				return nil, err
			}
			if c == nil {
				hi = mid
			} else {
				lo = mid
				record(lo, a, c, strategy)
			}
		}
	}
	return out, nil
}
