// Package schedule computes a training run's learning rate at every step:
// torch.optim.lr_scheduler's StepLR, MultiStepLR, CosineAnnealingLR and
// OneCycleLR, and a linear warmup, as pure functions of the step.
//
// In:  a Schedule (the train block's `schedule` and `warmup`), the run's
// base learning rate, the step (0-based, counted over the whole run), the
// batches per epoch and the run's epochs.
// Out: the learning rate of that step's update.
//
// Why a function and not a stateful scheduler as in PyTorch: a resumed run
// must continue exactly, and the step is all a checkpoint has to hold.
// PyTorch's conventions are kept: StepLR, MultiStepLR and
// CosineAnnealingLR count epochs (PyTorch's usual use calls their step()
// after each epoch, so every step of epoch e has the rate they give for
// e), OneCycleLR and the warmup count steps (step() after each batch).
// PyTorch updates rates recursively (lr ← lr·ratio); the closed forms here
// equal its numbers up to float64 rounding (tested step by step against
// PyTorch, scripts/torch_lr_schedule.py). The compiler (train block) and
// the trainers (runtime/trainer) share this package.
package schedule

import (
	"fmt"
	"math"
	"strings"
)

// Kind names a schedule.
type Kind uint8

const (
	Constant  Kind = iota // the base rate throughout
	Step                  // StepLR: × Gamma every Every epochs
	MultiStep             // MultiStepLR: × Gamma at each milestone epoch
	Cosine                // CosineAnnealingLR over TMax epochs, down to EtaMin
	OneCycle              // OneCycleLR over the run's steps, peaking at the base rate
)

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("schedule%d", k)
}

var kindNames = [...]string{"constant", "step", "multistep", "cosine", "onecycle"}

// Defaults of OneCycleLR (PyTorch's).
const (
	DefaultPctStart       = 0.3
	DefaultDivFactor      = 25
	DefaultFinalDivFactor = 1e4
)

// Schedule is a learning-rate schedule; the zero value keeps the base
// rate. The fields a kind does not use stay zero.
type Schedule struct {
	Kind Kind
	// Every is Step's period in epochs (StepLR's step_size).
	Every int
	// Gamma is Step's and MultiStep's factor.
	Gamma float64
	// Milestones are MultiStep's epochs, increasing.
	Milestones []int
	// EtaMin is Cosine's lowest rate (absolute, as eta_min).
	EtaMin float64
	// TMax is Cosine's half period in epochs; 0: the run's epochs.
	TMax int
	// OneCycle's pct_start, div_factor, final_div_factor (0: PyTorch's
	// defaults) and anneal_strategy ("cos", or "linear" when set). Its
	// max_lr is the run's base rate; momentum is not cycled (as PyTorch
	// with cycle_momentum=False).
	PctStart, DivFactor, FinalDivFactor float64
	LinearAnneal                        bool
	// Warmup is a number of steps of linear warmup: at step t < Warmup
	// the rate is multiplied by 1/N + (1 - 1/N)·t/N (N = Warmup), PyTorch's
	// LinearLR(start_factor=1/N, end_factor=1, total_iters=N) stepped after
	// every batch, chained with the schedule (see LR).
	Warmup int
}

// IsConstant says whether the rate is the base rate at every step.
func (s Schedule) IsConstant() bool { return s.Kind == Constant && s.Warmup == 0 }

// oneCycle returns OneCycle's factors with PyTorch's defaults for zeros.
func (s Schedule) oneCycle() (pct, div, finalDiv float64) {
	pct, div, finalDiv = s.PctStart, s.DivFactor, s.FinalDivFactor
	if pct == 0 {
		pct = DefaultPctStart
	}
	if div == 0 {
		div = DefaultDivFactor
	}
	if finalDiv == 0 {
		finalDiv = DefaultFinalDivFactor
	}
	return pct, div, finalDiv
}

// TotalSteps is the number of steps of a run: OneCycle's total_steps.
func TotalSteps(perEpoch, epochs int) int64 { return int64(perEpoch) * int64(epochs) }

// Check says why s cannot schedule a run of epochs epochs of perEpoch
// steps, or nil: OneCycle needs a step, and PyTorch's OneCycleLR divides
// by zero when its warm-up phase ends at step 0 (pct_start × total steps
// = 1).
func (s Schedule) Check(perEpoch, epochs int) error {
	if s.Kind != OneCycle {
		return nil
	}
	total := TotalSteps(perEpoch, epochs)
	if total < 1 {
		return fmt.Errorf("onecycle schedules the run's steps, and it has none (%d epochs of %d steps)", epochs, perEpoch)
	}
	pct, _, _ := s.oneCycle()
	if pct*float64(total)-1 == 0 {
		return fmt.Errorf("onecycle: pct_start %g of %d steps is one step: its warm-up phase would have no length (PyTorch divides by zero there); change pct_start or the epochs", pct, total)
	}
	return nil
}

// LR is the learning rate of step (0-based over the whole run) for a base
// rate, with perEpoch steps per epoch and a run of epochs epochs: the
// schedule's rate at the step's epoch (Step, MultiStep, Cosine) or at the
// step (OneCycle), times the warmup's factor during the first Warmup
// steps. That product is what PyTorch gives with LinearLR stepped after
// every batch and the schedule's scheduler after every epoch on one
// optimizer, both multiplying its rate (for Cosine with EtaMin > 0 as long
// as the warmup ends inside the first epoch: beyond that PyTorch's
// recursive cosine is not a product). OneCycle has its own warm-up phase
// and is not combined with Warmup (the train block refuses it).
func (s Schedule) LR(base float64, step int64, perEpoch, epochs int) float64 {
	lr := s.scheduled(base, step, perEpoch, epochs)
	if n := int64(s.Warmup); n > 0 && step < n {
		lr *= 1/float64(n) + (1-1/float64(n))*float64(step)/float64(n)
	}
	return lr
}

func (s Schedule) scheduled(base float64, step int64, perEpoch, epochs int) float64 {
	epoch := int64(0)
	if perEpoch > 0 {
		epoch = step / int64(perEpoch)
	}
	switch s.Kind {
	case Step:
		return base * math.Pow(s.Gamma, float64(epoch/int64(max(s.Every, 1))))
	case MultiStep:
		passed := 0 // milestones reached: PyTorch's bisect_right(milestones, epoch)
		for _, m := range s.Milestones {
			if int64(m) <= epoch {
				passed++
			}
		}
		return base * math.Pow(s.Gamma, float64(passed))
	case Cosine:
		tmax := s.TMax
		if tmax == 0 {
			tmax = epochs
		}
		if tmax < 1 {
			return base
		}
		return s.EtaMin + (base-s.EtaMin)*(1+math.Cos(math.Pi*float64(epoch)/float64(tmax)))/2
	case OneCycle:
		return s.oneCycleLR(base, step, TotalSteps(perEpoch, epochs))
	}
	return base
}

// oneCycleLR is OneCycleLR.get_lr (two phases) in PyTorch's arithmetic:
// from base/div_factor up to base over the first pct_start of the steps
// (phase end pct·total - 1, a float), then down to base/div_factor/
// final_div_factor at step total-1.
func (s Schedule) oneCycleLR(maxLR float64, step, total int64) float64 {
	pct, div, finalDiv := s.oneCycle()
	initial := maxLR / div
	lowest := initial / finalDiv
	end1 := pct*float64(total) - 1
	t := float64(step)
	if t <= end1 {
		return s.anneal(initial, maxLR, t/end1)
	}
	return s.anneal(maxLR, lowest, (t-end1)/(float64(total-1)-end1))
}

// anneal goes from start to end as frac goes from 0 to 1: half a cosine,
// or a line.
func (s Schedule) anneal(start, end, frac float64) float64 {
	if s.LinearAnneal {
		return (end-start)*frac + start
	}
	return end + (start-end)/2*(math.Cos(math.Pi*frac)+1)
}

// String is the schedule as the train block writes it, with the warmup
// ("cosine(eta_min=0), warmup 500 steps"); "constant" for none.
func (s Schedule) String() string {
	var b strings.Builder
	switch s.Kind {
	case Step:
		fmt.Fprintf(&b, "step(every=%d, gamma=%g)", s.Every, s.Gamma)
	case MultiStep:
		ms := make([]string, len(s.Milestones))
		for i, m := range s.Milestones {
			ms[i] = fmt.Sprint(m)
		}
		fmt.Fprintf(&b, "multistep(milestones=[%s], gamma=%g)", strings.Join(ms, ", "), s.Gamma)
	case Cosine:
		fmt.Fprintf(&b, "cosine(eta_min=%g", s.EtaMin)
		if s.TMax > 0 {
			fmt.Fprintf(&b, ", t_max=%d", s.TMax)
		}
		b.WriteString(")")
	case OneCycle:
		pct, div, finalDiv := s.oneCycle()
		anneal := "cos"
		if s.LinearAnneal {
			anneal = "linear"
		}
		fmt.Fprintf(&b, "onecycle(pct_start=%g, div_factor=%g, final_div_factor=%g, anneal_strategy=%q)", pct, div, finalDiv, anneal)
	default:
		b.WriteString("constant")
	}
	if s.Warmup > 0 {
		fmt.Fprintf(&b, ", warmup %d steps", s.Warmup)
	}
	return b.String()
}
