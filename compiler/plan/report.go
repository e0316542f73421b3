package plan

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/cnnc/cnnc/compiler"
)

// CategoryBytes returns the bytes live at step s by category: a buffer
// counts in the category of the value it holds then (a buffer handed on
// in place changes category, e.g. saved activation -> transient gradient).
func (p *Plan) CategoryBytes(s int) [NumCategories]int64 {
	var out [NumCategories]int64
	for _, b := range p.Buffers {
		if s < b.FirstStep || s > b.LastStep {
			continue
		}
		out[b.categoryAt(s)] += b.Bytes
	}
	return out
}

func (b *Buffer) categoryAt(s int) Category {
	c := b.Category
	for _, h := range b.Holds {
		if h.FirstStep <= s {
			c = h.Category
		}
	}
	return c
}

// valueAt names what the buffer holds at step s.
func (b *Buffer) valueAt(s int) string {
	v := b.Holds[0].Value
	for _, h := range b.Holds {
		if h.FirstStep <= s {
			v = h.Value
		}
	}
	return v
}

// ReportOptions tune WriteReport.
type ReportOptions struct {
	// Optimizer describes the update, e.g. "sgd(lr=0.01,momentum=0.9)".
	Optimizer string
	// Plot names the timeline figure, when one was written.
	Plot string
	// BudgetFrom says where the budget was set, e.g. "memory_budget at
	// model.cnn:19:21" or "--memory-budget".
	BudgetFrom string
}

// WriteReport prints the plan for people, like torch.cuda.memory_summary
// but before anything runs: the peak and what is live there, a breakdown
// by category, the choices made (split updates, in-place outputs,
// recomputation and its FLOPs, micro-batching), every step with the bytes
// live during it, and every buffer with its offset and DSL position.
func (p *Plan) WriteReport(w io.Writer, o ReportOptions) {
	p.reportSummary(w, o)
	p.reportDataParallel(w)
	p.reportChoices(w)
	p.reportCategories(w)
	p.reportLiveAtPeak(w)
	p.reportSteps(w)
	p.reportBuffers(w)
	if o.Plot != "" {
		fmt.Fprintf(w, "\nmemory timeline: %s\n", o.Plot)
	}
}

// extraPercent is recomputation's FLOPs as a percentage of the step's own.
func (p *Plan) extraPercent() float64 {
	if base := p.FLOPs - p.ExtraFLOPs; base > 0 {
		return 100 * float64(p.ExtraFLOPs) / float64(base)
	}
	return 0
}

// reportSummary is the title and the peak, budget, FLOPs and strategy.
func (p *Plan) reportSummary(w io.Writer, o ReportOptions) {
	peak := p.Steps[p.PeakStep]
	title := fmt.Sprintf("cnnc memory plan: %s, batch %d", p.Model, p.Batch)
	if p.Inference {
		title = fmt.Sprintf("cnnc inference memory plan: %s, batch %d (forward only)", p.Model, p.Batch)
	}
	if dp := p.DataParallel; dp != nil {
		title += fmt.Sprintf(" per rank of %d (global batch %d)", dp.Ranks, dp.GlobalBatch)
	}
	if p.Accumulate > 1 {
		title += fmt.Sprintf(" per update (accumulate = %d batches of %d)", p.Accumulate, p.Batch/p.Accumulate)
	}
	if o.Optimizer != "" && !p.Inference {
		title += ", " + o.Optimizer
	}
	fmt.Fprintln(w, title)
	fmt.Fprintln(w, strings.Repeat("=", len(title)))
	pct := p.extraPercent()
	budget := fmt.Sprintf("none: the smallest peak found recomputing memory-bound layers (batch norm's normalisation, activations, pools), and convs within %d%% of the step's FLOPs, from saved values, no micro-batching", 100/computeRecomputeShare)
	if p.Choices.MicroBatched != "" && p.Accumulate <= 1 {
		// asked for (--micro-batch): the search never micro-batches without a budget
		budget = fmt.Sprintf("none: micro-batches of %d as asked (the search micro-batches only under a budget)", p.Choices.MicroBatch)
	}
	if p.BudgetBytes > 0 {
		from := ""
		if o.BudgetFrom != "" {
			from = ", " + o.BudgetFrom
		}
		budget = fmt.Sprintf("%s (%s%s): fits, %s to spare", commas(p.BudgetBytes), mb(p.BudgetBytes), from, mb(p.BudgetBytes-p.PeakBytes))
	}
	table(w, [][]string{
		{"peak", fmt.Sprintf("%s (%s): the arena, the one allocation the runtime makes", commas(p.PeakBytes), mb(p.PeakBytes))},
		{"at step", fmt.Sprintf("%d of %d: %s (%s), %s", p.PeakStep, len(p.Steps), peak.Label(), stepPhase(peak), peak.Pos)},
		{"budget", budget},
		{"step FLOPs", fmt.Sprintf("%s; recomputation +%s (%.1f%% of the step)", gflops(p.FLOPs), gflops(p.ExtraFLOPs), pct)},
		{"strategy", p.Choices.Strategy + ": " + p.StrategyWords()},
	}, []bool{false, false}, "  ")
}

// reportChoices lists the planner's choices: updates, in place,
// recomputation, micro-batch loops.
func (p *Plan) reportChoices(w io.Writer) {
	pct := p.extraPercent()
	fmt.Fprintln(w, "\nChoices")
	var rows [][]string
	if len(p.Choices.SplitUpdates) > 0 {
		rows = append(rows, []string{"split updates", strings.Join(p.Choices.SplitUpdates, ", "),
			"weight gradient first, into a gradient buffer; input gradient in place; separate update"})
	}
	if len(p.Choices.FusedUpdates) > 0 {
		rows = append(rows, []string{"fused updates", strings.Join(p.Choices.FusedUpdates, ", "), "update inside the weight-gradient kernel: no gradient buffer"})
	}
	if cc := p.Clip; cc != nil && cc.NormStep >= 0 {
		cost := fmt.Sprintf("%s of gradients live until the norm at step %d (%s live there)", mb(cc.GradientBytes), cc.NormStep, mb(cc.LiveBytes))
		if cc.UnclippedPeakBytes > 0 {
			d, sign := p.PeakBytes-cc.UnclippedPeakBytes, "+"
			if d < 0 {
				d, sign = -d, "-"
			}
			cost += fmt.Sprintf("; peak %s vs %s without clipping (%s%s)", mb(p.PeakBytes), mb(cc.UnclippedPeakBytes), sign, commas(d))
		}
		rows = append(rows, []string{"clip_grad_norm", fmt.Sprintf("max_norm %g: global norm at step %d, %d separate updates after it", cc.MaxNorm, cc.NormStep, cc.Updates), cost})
	}
	inPlace := "none"
	if len(p.Choices.InPlace) > 0 {
		inPlace = strings.Join(p.Choices.InPlace, "; ")
	}
	rows = append(rows, []string{"in place", inPlace, ""})
	rec := "none"
	if len(p.Choices.Recompute) > 0 {
		rec = strings.Join(p.Choices.Recompute, ", ")
	}
	rows = append(rows, []string{"recompute", rec, fmt.Sprintf("+%s, %.1f%% of the step", gflops(p.ExtraFLOPs), pct)})
	if len(p.Loops) == 0 {
		rows = append(rows, []string{"micro-batch", "none", fmt.Sprintf("the whole batch of %d at once", p.Batch)})
	}
	for i, l := range p.Loops {
		rows = append(rows, []string{fmt.Sprintf("loop %d", i), fmt.Sprintf("steps %d..%d", l.FirstStep, l.LastStep),
			fmt.Sprintf("%d micro-batches of %d: %s", l.Count, l.MicroBatch, l.What)})
	}
	table(w, rows, []bool{false, false, false}, "  ")
}

// reportCategories is the bytes by category at the peak and at most.
func (p *Plan) reportCategories(w io.Writer) {
	fmt.Fprintf(w, "\nMemory by category: at the peak (step %d), and the most during the step\n", p.PeakStep)
	atPeak := p.CategoryBytes(p.PeakStep)
	var most [NumCategories]int64
	for s := range p.Steps {
		c := p.CategoryBytes(s)
		for i := range most {
			most[i] = max(most[i], c[i])
		}
	}
	rows := [][]string{{"category", "at the peak", "", "most", ""}}
	var total int64
	for c := Category(0); c < NumCategories; c++ {
		rows = append(rows, []string{c.Title(), commas(atPeak[c]), mb(atPeak[c]), commas(most[c]), mb(most[c])})
		total += atPeak[c]
	}
	rows = append(rows, []string{"total live", commas(total), mb(total), "", ""})
	rows = append(rows, []string{"arena", commas(p.ArenaBytes), mb(p.ArenaBytes), "", ""})
	table(w, rows, []bool{false, true, true, true, true}, "  ")
	ws := "no kernel of this plan needs scratch memory"
	if n := p.workspaceSteps(); n > 0 {
		ws = fmt.Sprintf("%d steps' kernels use scratch memory, each buffer live during its step only", n)
	}
	fmt.Fprintf(w, "  (arena - most live at once = %s (%s) of alignment and gaps; workspace: %s)\n", commas(p.ArenaBytes-p.MaxLiveBytes), mb(p.ArenaBytes-p.MaxLiveBytes), ws)
}

// reportLiveAtPeak lists the buffers live at the peak, largest first.
func (p *Plan) reportLiveAtPeak(w io.Writer) {
	peak := p.Steps[p.PeakStep]
	fmt.Fprintf(w, "\nLive at the peak (step %d: %s)\n", p.PeakStep, peak.Label())
	var live []*Buffer
	for _, b := range p.Buffers {
		if p.PeakStep >= b.FirstStep && p.PeakStep <= b.LastStep {
			live = append(live, b)
		}
	}
	sort.SliceStable(live, func(i, j int) bool { return live[i].Bytes > live[j].Bytes })
	rows := [][]string{{"holds", "category", "bytes", "", "offset", "steps", "source"}}
	for _, b := range live {
		rows = append(rows, []string{b.valueAt(p.PeakStep), b.categoryAt(p.PeakStep).String(), commas(b.Bytes), mb(b.Bytes),
			fmt.Sprint(b.Offset), fmt.Sprintf("%d..%d", b.FirstStep, b.LastStep), b.Pos.String()})
	}
	table(w, rows, []bool{false, false, true, true, true, false, false}, "  ")
}

// reportSteps lists every step with the bytes live during it.
func (p *Plan) reportSteps(w io.Writer) {
	fmt.Fprintln(w, "\nSteps")
	rows := [][]string{{"step", "phase", "kernel", "layer", "samples", "live", "GFLOP", "loop", "note"}}
	for _, s := range p.Steps {
		loop, note := "", ""
		if s.Loop >= 0 {
			l := p.Loops[s.Loop]
			loop = fmt.Sprintf("%d (x%d)", s.Loop, l.Count)
		}
		var notes []string
		if s.Recompute {
			notes = append(notes, "recompute")
		}
		if s.Accumulate {
			notes = append(notes, "accumulates")
		}
		if len(s.Updates) > 0 {
			notes = append(notes, "updates "+strings.Join(s.Updates, ", "))
		}
		for _, out := range s.Outs {
			if out.InPlace {
				notes = append(notes, "in place: "+out.Value)
			}
		}
		if s.Index == p.PeakStep {
			notes = append(notes, "<- peak")
		}
		note = strings.Join(notes, "; ")
		layer := s.Layer
		if s.Kernel == "sgd_update" || s.Kernel == "adam_update" {
			layer = strings.TrimSuffix(s.Label(), " update") // "conv2 weight"
		}
		rows = append(rows, []string{fmt.Sprint(s.Index), stepPhase(s), s.Kernel, layer, fmt.Sprint(s.Samples),
			mb(s.LiveBytes), fmt.Sprintf("%.3f", float64(s.FLOPs)/1e9), loop, note})
	}
	table(w, rows, []bool{true, false, false, false, true, true, true, false, false}, "  ")
}

// reportBuffers lists every buffer by offset, with what it holds.
func (p *Plan) reportBuffers(w io.Writer) {
	fmt.Fprintln(w, "\nBuffers (by offset)")
	all := append([]*Buffer(nil), p.Buffers...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].Offset < all[j].Offset })
	rows := [][]string{{"offset", "bytes", "buffer", "type", "category", "steps", "holds", "source"}}
	for _, b := range all {
		steps := fmt.Sprintf("%d..%d", b.FirstStep, b.LastStep)
		if b.Persistent {
			steps = "all"
		} else if b.Loop >= 0 {
			steps += fmt.Sprintf(" (each iteration of loop %d)", b.Loop)
		}
		var holds []string
		for _, h := range b.Holds {
			s := h.Value
			if h.InPlace {
				s += " (in place)"
			}
			if len(h.Views) > 0 {
				s += " = " + strings.Join(h.Views, " = ")
			}
			holds = append(holds, s)
		}
		rows = append(rows, []string{fmt.Sprint(b.Offset), commas(b.Bytes), b.Name, b.Type, b.Category.String(), steps, strings.Join(holds, ", then "), b.Pos.String()})
	}
	table(w, rows, []bool{true, true, false, false, false, false, false, false}, "  ")
}

// StrategyWords says in words how the plan meets its budget: what runs in
// micro-batches, or what is recomputed, or neither.
func (p *Plan) StrategyWords() string {
	switch p.Choices.MicroBatched {
	case "trunk":
		return fmt.Sprintf("%s..%s run in micro-batches of %d (recomputing the trunk in the backward loop, accumulating its gradients); the rest on the whole batch",
			p.Choices.Trunk[0], p.Choices.Trunk[len(p.Choices.Trunk)-1], p.Choices.MicroBatch)
	case "step":
		if p.Accumulate > 1 {
			return fmt.Sprintf("gradient accumulation (the train block's accumulate = %d): each update trains on %d samples in %d micro-batches of %d, accumulating every gradient; activations take the memory of a batch of %d, gradients and the update's input are whole",
				p.Accumulate, p.Batch, p.Accumulate, p.Choices.MicroBatch, p.Choices.MicroBatch)
		}
		return fmt.Sprintf("the whole step runs in micro-batches of %d, accumulating every gradient", p.Choices.MicroBatch)
	}
	if len(p.Choices.Recompute) > 0 {
		return "the outputs of " + strings.Join(p.Choices.Recompute, ", ") + " are dropped after the forward pass and recomputed before the backward pass needs them"
	}
	return "no recomputation, no micro-batching"
}

func stepPhase(s *Step) string {
	if s.Recompute {
		return "recompute"
	}
	return s.Phase
}

func gflops(f int64) string { return fmt.Sprintf("%.3f GFLOP", float64(f)/1e9) }

// table prints aligned columns (compiler.PrintTable).
func table(w io.Writer, rows [][]string, right []bool, indent string) {
	compiler.PrintTable(w, rows, right, indent)
}

// workspaceSteps counts the steps with a workspace buffer.
func (p *Plan) workspaceSteps() int {
	n := 0
	for _, s := range p.Steps {
		if s.Workspace >= 0 {
			n++
		}
	}
	return n
}
