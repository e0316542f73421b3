package perf

import (
	"fmt"
	"io"
	"strings"

	"github.com/cnnc/cnnc/codegen/trainergen"
)

// Choice is the performance model's pick among the plans that meet a
// memory budget (driver.Alternatives): the fastest predicted step, ties
// going to the smaller peak, then to the earlier alternative (the
// planner's own choice comes first: the minimal-memory plan, its updates
// split wherever that saves bytes; others may keep updates fused in their
// weight-gradient kernels, fewer launches for more memory). For a
// data-parallel rank on a known fabric the step compared is the rank's
// with its all-reduces (and a sharded optimizer's broadcasts): a plan
// whose backward pass hides them better may win over one whose launches
// alone are faster.
type Choice struct {
	// Best is the chosen plan and Prediction its step; Parallel is its
	// data-parallel step when Fastest was given a fabric.
	Best       *trainergen.Compiled `json:"-"`
	Prediction *Prediction          `json:"-"`
	Parallel   *ParallelPrediction  `json:"-"`
	// Considered are all alternatives, in the order given; Chosen marks Best.
	Considered []Considered `json:"alternatives"`
	// Unbudgeted is the plan without the budget (nil when there is none),
	// and BudgetCostSeconds what the budget adds to the predicted step:
	// the chosen step minus the unbudgeted one.
	Unbudgeted        *Considered `json:"unbudgeted,omitempty"`
	BudgetCostSeconds float64     `json:"budget_cost_seconds"`
}

// Considered is one plan's summary: how it meets the budget, its peak and
// its predicted step.
type Considered struct {
	Strategy  string `json:"strategy"`
	How       string `json:"how"`
	PeakBytes int64  `json:"peak_bytes"`
	Launches  int    `json:"launches"`
	// SplitUpdates are the layers whose optimizer update runs as a launch
	// of its own (plan.Choices.SplitUpdates).
	SplitUpdates []string `json:"split_updates"`
	// FusedUpdates are those whose update runs inside the weight-gradient
	// kernel (plan.Choices.FusedUpdates).
	FusedUpdates         []string `json:"fused_updates"`
	PredictedStepSeconds float64  `json:"predicted_step_seconds"`
	// DataParallelStepSeconds is the rank's step with its collectives on
	// the fabric Fastest was given (0 without one); the choice compares it
	// when set.
	DataParallelStepSeconds float64 `json:"data_parallel_step_seconds,omitempty"`
	Chosen                  bool    `json:"chosen,omitempty"`
}

// step is the step the choice compares.
func (c Considered) step() float64 {
	if c.DataParallelStepSeconds > 0 {
		return c.DataParallelStepSeconds
	}
	return c.PredictedStepSeconds
}

// Fastest predicts every alternative (and the unbudgeted plan, when given)
// on gpu and returns the choice. With a fabric (nil: none) the
// alternatives must be ranks of a data-parallel plan on it, and each is
// judged by its data-parallel step (ParallelStep).
func Fastest(alts []*trainergen.Compiled, unbudgeted *trainergen.Compiled, gpu GPU, fabric *Fabric) (*Choice, error) {
	if len(alts) == 0 {
		return nil, fmt.Errorf("perf: no plan to choose from")
	}
	ch := &Choice{}
	preds := make([]*Prediction, len(alts))
	pars := make([]*ParallelPrediction, len(alts))
	for i, comp := range alts {
		c, p, pp, err := consider(comp, gpu, fabric)
		if err != nil {
			return nil, err
		}
		preds[i], pars[i] = p, pp
		ch.Considered = append(ch.Considered, c)
	}
	best := fastest(ch.Considered)
	ch.Best, ch.Prediction, ch.Parallel = alts[best], preds[best], pars[best]
	ch.Considered[best].Chosen = true
	if unbudgeted != nil {
		u, _, _, err := consider(unbudgeted, gpu, fabric)
		if err != nil {
			return nil, err
		}
		ch.Unbudgeted = &u
		ch.BudgetCostSeconds = ch.Considered[best].step() - u.step()
	}
	return ch, nil
}

// consider predicts one plan on gpu, and with a fabric its data-parallel
// step too.
func consider(comp *trainergen.Compiled, gpu GPU, fabric *Fabric) (Considered, *Prediction, *ParallelPrediction, error) {
	p, err := Predict(comp, gpu)
	if err != nil {
		return Considered{}, nil, nil, err
	}
	c := summarise(comp, p)
	if fabric == nil {
		return c, p, nil, nil
	}
	pp, err := ParallelStep(comp, p, *fabric)
	if err != nil {
		return Considered{}, nil, nil, err
	}
	c.DataParallelStepSeconds = pp.PredictedStepSeconds
	return c, p, pp, nil
}

// fastest is the index of the alternative with the shortest predicted
// step; ties go to the smaller peak, then to the earlier alternative.
func fastest(cs []Considered) int {
	best := 0
	for i, c := range cs {
		b := cs[best]
		if c.step() < b.step() || c.step() == b.step() && c.PeakBytes < b.PeakBytes {
			best = i
		}
	}
	return best
}

func summarise(comp *trainergen.Compiled, p *Prediction) Considered {
	return Considered{Strategy: comp.Plan.Choices.Strategy, How: comp.Plan.StrategyWords(), PeakBytes: comp.Plan.ArenaBytes,
		Launches: len(p.Launches), SplitUpdates: comp.Plan.Choices.SplitUpdates, FusedUpdates: comp.Plan.Choices.FusedUpdates,
		PredictedStepSeconds: p.PredictedStepSeconds}
}

// WriteChoice prints the plans considered for a budget and what the
// budget costs; the chosen plan's table follows it (WriteTable).
func (ch *Choice) WriteChoice(w io.Writer, gpu string, budget int64) {
	fmt.Fprintf(w, "Plans that meet the memory budget of %.2f MB, predicted on %s (PREDICTIONS; the fastest is chosen):\n", float64(budget)/1e6, gpu)
	for _, c := range ch.Considered {
		mark := " "
		if c.Chosen {
			mark = "*"
		}
		fmt.Fprintf(w, "  %s %-11s peak %8.2f MB  %4d launches  %9.1f µs%s  %s; %s\n", mark, c.Strategy, float64(c.PeakBytes)/1e6, c.Launches, 1e6*c.step(), dataParallelWords(c), c.How, updateWords(c))
	}
	m, best := ch.Considered[0], ch.chosen()
	fmt.Fprintf(w, "  minimal-memory plan (the planner's own, as without --gpu; --min-memory keeps it): peak %.2f MB, %.1f µs; chosen: peak %.2f MB, %.1f µs\n",
		float64(m.PeakBytes)/1e6, 1e6*m.step(), float64(best.PeakBytes)/1e6, 1e6*best.step())
	if u := ch.Unbudgeted; u != nil {
		fmt.Fprintf(w, "  without the budget (the planner then minimises the peak): peak %.2f MB, %d launches, %.1f µs%s: the budget costs %+.1f µs a step (%+.0f%%)\n",
			float64(u.PeakBytes)/1e6, u.Launches, 1e6*u.step(), dataParallelWords(*u), 1e6*ch.BudgetCostSeconds, 100*ch.BudgetCostSeconds/u.step())
	}
	fmt.Fprintln(w)
}

// dataParallelWords says, for a rank judged by its data-parallel step,
// what its launches alone take.
func dataParallelWords(c Considered) string {
	if c.DataParallelStepSeconds == 0 {
		return ""
	}
	return fmt.Sprintf(" with its collectives (launches %.1f µs)", 1e6*c.PredictedStepSeconds)
}

// chosen is the chosen alternative's summary.
func (ch *Choice) chosen() Considered {
	for _, c := range ch.Considered {
		if c.Chosen {
			return c
		}
	}
	return ch.Considered[0]
}

// updateWords says which updates run as launches of their own.
func updateWords(c Considered) string {
	switch {
	case len(c.SplitUpdates) > 0:
		return "split updates: " + strings.Join(c.SplitUpdates, ", ")
	case len(c.FusedUpdates) > 0:
		return "every update fused"
	}
	return "no fused updates"
}
