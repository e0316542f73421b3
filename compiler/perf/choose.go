package perf

import (
	"fmt"
	"io"

	"github.com/cnnc/cnnc/codegen/trainergen"
)

// Choice is the performance model's pick among the plans that meet a
// memory budget (driver.Alternatives): the fastest predicted step, ties
// going to the smaller peak, then to the earlier alternative (the
// planner's own choice comes first).
type Choice struct {
	// Best is the chosen plan and Prediction its step.
	Best       *trainergen.Compiled `json:"-"`
	Prediction *Prediction          `json:"-"`
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
	Strategy             string  `json:"strategy"`
	How                  string  `json:"how"`
	PeakBytes            int64   `json:"peak_bytes"`
	Launches             int     `json:"launches"`
	PredictedStepSeconds float64 `json:"predicted_step_seconds"`
	Chosen               bool    `json:"chosen,omitempty"`
}

// Fastest predicts every alternative (and the unbudgeted plan, when given)
// on gpu and returns the choice.
func Fastest(alts []*trainergen.Compiled, unbudgeted *trainergen.Compiled, gpu GPU) (*Choice, error) {
	if len(alts) == 0 {
		return nil, fmt.Errorf("perf: no plan to choose from")
	}
	ch := &Choice{}
	preds := make([]*Prediction, len(alts))
	for i, comp := range alts {
		p, err := Predict(comp, gpu)
		if err != nil {
			return nil, err
		}
		preds[i] = p
		ch.Considered = append(ch.Considered, summarise(comp, p))
	}
	best := fastest(ch.Considered)
	ch.Best, ch.Prediction = alts[best], preds[best]
	ch.Considered[best].Chosen = true
	if unbudgeted != nil {
		p, err := Predict(unbudgeted, gpu)
		if err != nil {
			return nil, err
		}
		u := summarise(unbudgeted, p)
		ch.Unbudgeted = &u
		ch.BudgetCostSeconds = ch.Prediction.PredictedStepSeconds - p.PredictedStepSeconds
	}
	return ch, nil
}

// fastest is the index of the alternative with the shortest predicted
// step; ties go to the smaller peak, then to the earlier alternative.
func fastest(cs []Considered) int {
	best := 0
	for i, c := range cs {
		b := cs[best]
		if c.PredictedStepSeconds < b.PredictedStepSeconds ||
			c.PredictedStepSeconds == b.PredictedStepSeconds && c.PeakBytes < b.PeakBytes {
			best = i
		}
	}
	return best
}

func summarise(comp *trainergen.Compiled, p *Prediction) Considered {
	return Considered{Strategy: comp.Plan.Choices.Strategy, How: comp.Plan.StrategyWords(), PeakBytes: comp.Plan.ArenaBytes,
		Launches: len(p.Launches), PredictedStepSeconds: p.PredictedStepSeconds}
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
		fmt.Fprintf(w, "  %s %-11s peak %8.2f MB  %4d launches  %9.1f µs  %s\n", mark, c.Strategy, float64(c.PeakBytes)/1e6, c.Launches, 1e6*c.PredictedStepSeconds, c.How)
	}
	if u := ch.Unbudgeted; u != nil {
		fmt.Fprintf(w, "  without the budget: peak %.2f MB, %d launches, %.1f µs: the budget costs %+.1f µs a step (%+.0f%%)\n",
			float64(u.PeakBytes)/1e6, u.Launches, 1e6*u.PredictedStepSeconds, 1e6*ch.BudgetCostSeconds, 100*ch.BudgetCostSeconds/u.PredictedStepSeconds)
	}
	fmt.Fprintln(w)
}
