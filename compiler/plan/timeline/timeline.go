// Package timeline draws a memory plan's timeline: the bytes live during
// each kernel of the training step, stacked by category, with the budget
// and the arena as lines — the picture of where memory goes and what sets
// the peak.
//
// In:  a *plan.Plan and a file name (.svg, .png or .pdf).
// Out: the figure, drawn with gonum.org/v1/plot.
package timeline

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/units"
)

// colors per category: parameters and state in blues (fixed for the
// whole step), activations in warm colours, inputs grey.
var colors = [plan.NumCategories]color.RGBA{
	plan.CatParam:     {0x1f, 0x4e, 0x79, 0xff},
	plan.CatState:     {0x5b, 0x9b, 0xd5, 0xff},
	plan.CatGrad:      {0x70, 0xad, 0x47, 0xff},
	plan.CatSaved:     {0xed, 0x7d, 0x31, 0xff},
	plan.CatArgmax:    {0xff, 0xc0, 0x00, 0xff},
	plan.CatTransient: {0xc0, 0x50, 0x4d, 0xff},
	plan.CatWorkspace: {0x7f, 0x3f, 0xbf, 0xff},
	plan.CatInput:     {0xa5, 0xa5, 0xa5, 0xff},
	plan.CatBuffer:    {0x2e, 0x75, 0xb6, 0xff},
}

// Write draws p's timeline into file; the extension picks the format.
func Write(p *plan.Plan, file string) error {
	switch ext := strings.ToLower(filepath.Ext(file)); ext {
	case ".svg", ".png", ".pdf":
	default:
		return fmt.Errorf("timeline: %s: write .svg, .png or .pdf, not %q", file, ext)
	}
	fig, err := Figure(p)
	if err != nil {
		return err
	}
	width := vg.Length(math.Max(18, 0.9*float64(len(p.Steps))+6)) * vg.Centimeter
	return fig.Save(width, 16*vg.Centimeter, file)
}

// Figure builds the plot.
func Figure(p *plan.Plan) (*plot.Plot, error) {
	n := len(p.Steps)
	per := make([][plan.NumCategories]int64, n)
	var used [plan.NumCategories]bool
	for s := range p.Steps {
		per[s] = p.CategoryBytes(s)
		for c, b := range per[s] {
			used[c] = used[c] || b > 0
		}
	}
	fig := plot.New()
	fig.Title.Text = fmt.Sprintf("%s, batch %d: memory live during each kernel of one training step", p.Model, p.Batch)
	scale, unit := axisUnit(max(p.ArenaBytes, p.BudgetBytes))
	fig.Y.Label.Text = fmt.Sprintf("%s live (1 %s = %s bytes)", unit, unit, compiler.Commas(int64(scale)))
	if scale == 1 {
		fig.Y.Label.Text = "bytes live"
	}
	fig.X.Label.Text = "kernel (in order; * = inside a micro-batch loop, per micro-batch)"
	var below *plotter.BarChart
	for c := plan.Category(0); c < plan.NumCategories; c++ {
		if !used[c] {
			continue
		}
		vals := make(plotter.Values, n)
		for s := range per {
			vals[s] = float64(per[s][c]) / scale
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(14))
		if err != nil {
			return nil, err
		}
		bars.Color = colors[c]
		bars.LineStyle.Width = 0
		if below != nil {
			bars.StackOn(below)
		}
		fig.Add(bars)
		fig.Legend.Add(c.Title(), bars)
		below = bars
	}
	top := float64(p.ArenaBytes) / scale
	line := func(y float64, label string, col color.RGBA, dashed bool) error {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(n) - 0.5, Y: y}})
		if err != nil {
			return err
		}
		l.Color, l.Width = col, vg.Points(1.5)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		fig.Add(l)
		fig.Legend.Add(label, l)
		return nil
	}
	if err := line(top, "arena = peak, "+units.FormatBytes(p.ArenaBytes), color.RGBA{0, 0, 0, 0xff}, false); err != nil {
		return nil, err
	}
	if p.BudgetBytes > 0 {
		budget := float64(p.BudgetBytes) / scale
		if err := line(budget, "budget, "+units.FormatBytes(p.BudgetBytes), color.RGBA{0xd0, 0, 0, 0xff}, true); err != nil {
			return nil, err
		}
		top = math.Max(top, budget)
	}
	fig.Y.Min, fig.Y.Max = 0, top*1.8 // room for the legend above the bars
	fig.Legend.Top = true
	fig.Legend.Left = true
	fig.Legend.ThumbnailWidth = vg.Points(14)
	names := make([]string, n)
	for i, s := range p.Steps {
		names[i] = stepLabel(s)
	}
	fig.NominalX(names...)
	fig.X.Tick.Label.Rotation = math.Pi / 2
	fig.X.Tick.Label.XAlign = draw.XRight
	fig.X.Tick.Label.YAlign = draw.YCenter
	return fig, nil
}

// axisUnit is the decimal unit that fits the largest value on the axis
// (as units.FormatBytes picks it): its size in bytes and its name.
func axisUnit(most int64) (float64, string) {
	u := strings.Fields(units.FormatBytes(most))[1]
	return map[string]float64{"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[u], u
}

// stepLabel is a short tick label: "7 fc1 dX", "9 conv1 fwd (re)*",
// "12 conv2 weight update".
func stepLabel(s *plan.Step) string {
	short := map[string]string{
		"conv2d_block": "fwd", "linear_block": "fwd", "softmax_cross_entropy": "loss",
		"conv2d_block_grad_input": "dX", "linear_block_grad_input": "dX",
		"conv2d_block_grad_weight": "dW", "linear_block_grad_weight": "dW",
	}[s.Kernel]
	if short == "" {
		short = s.Kernel
	}
	l := fmt.Sprintf("%d %s %s", s.Index, s.Layer, short)
	if s.Kernel == "sgd_update" || s.Kernel == "adam_update" {
		l = fmt.Sprintf("%d %s", s.Index, s.Label()) // which parameter: "conv2 weight update"
	}
	if s.Recompute {
		l += " (re)"
	}
	if s.Loop >= 0 {
		l += "*"
	}
	return l
}
