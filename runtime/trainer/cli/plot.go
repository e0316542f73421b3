package cli

import (
	"fmt"
	"image/color"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/cnnc/cnnc/runtime/trainer"
)

// curves are what --plot draws: every step's loss, accuracy and learning
// rate, and the epochs' (at the step each ended), with their throughput.
type curves struct {
	steps  []stepPoint
	epochs []trainer.EpochMetrics
}

type stepPoint struct {
	step          int64
	loss, acc, lr float64
}

func (c *curves) addStep(m *trainer.StepMetrics) {
	c.steps = append(c.steps, stepPoint{m.Step, float64(m.Loss), float64(m.Correct) / float64(m.Size), float64(m.LR)})
}

// smoothing is the exponential moving average's weight of the past for
// the per-step curves, from the run's length: about 1/50 of the steps
// (at least 1) inside the average's time constant, so that a 100-step run
// and a 100,000-step one both show their trend rather than their noise.
func smoothing(n int) float64 {
	window := max(1.0, float64(n)/50)
	return 1 - 1/window
}

// draw writes four panels against the step to a .png or .svg file: the
// loss and the accuracy (each step faint, smoothed solid, the epochs as
// marked points: train solid, test dashed), the learning rate of every
// step, and each epoch's throughput (images/s).
func (c *curves) draw(path, model string) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("write a .png or .svg file")
	}
	loss := newPanel(model+": loss", "cross-entropy")
	acc := newPanel(model+": accuracy", "accuracy (%)")
	perStep := func(p *plot.Plot, y func(stepPoint) float64, scale float64) error {
		raw, smooth := make(plotter.XYs, len(c.steps)), make(plotter.XYs, len(c.steps))
		alpha, avg := smoothing(len(c.steps)), 0.0
		for i, s := range c.steps {
			v := scale * y(s)
			if i == 0 {
				avg = v
			}
			avg = alpha*avg + (1-alpha)*v
			raw[i], smooth[i] = plotter.XY{X: float64(s.step), Y: v}, plotter.XY{X: float64(s.step), Y: avg}
		}
		return addLines(p, raw, smooth)
	}
	if err := perStep(loss, func(s stepPoint) float64 { return s.loss }, 1); err != nil {
		return err
	}
	if err := perStep(acc, func(s stepPoint) float64 { return s.acc }, 100); err != nil {
		return err
	}
	if err := c.addEpochs(loss, acc); err != nil {
		return err
	}
	lr, err := c.lrPanel(model)
	if err != nil {
		return err
	}
	speed, err := c.throughputPanel(model)
	if err != nil {
		return err
	}
	// loss and accuracy above, learning rate and throughput below
	const w, h = 10 * vg.Inch, 8 * vg.Inch
	img, err := newCanvas(ext, w, h)
	if err != nil {
		return err
	}
	cells := img.grid(2, 2)
	for i, p := range []*plot.Plot{loss, acc, lr, speed} {
		p.Draw(cells[i])
	}
	return img.save(path)
}

// lrPanel draws every step's learning rate.
func (c *curves) lrPanel(model string) (*plot.Plot, error) {
	p := newPanel(model+": learning rate", "learning rate")
	pts := make(plotter.XYs, len(c.steps))
	for i, s := range c.steps {
		pts[i] = plotter.XY{X: float64(s.step), Y: s.lr}
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Color = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add("per step", l)
	// from 0, so that a rate reads as its size: a constant rate would
	// otherwise get an axis centred on it, its line at the 0 tick
	p.Y.Min = 0
	if top := p.Y.Max; top > 0 {
		p.Y.Max = 1.1 * top
	}
	return p, nil
}

// throughputPanel marks each epoch's images per second of training.
func (c *curves) throughputPanel(model string) (*plot.Plot, error) {
	p := newPanel(model+": throughput", "images/s (training)")
	if len(c.epochs) == 0 {
		return p, nil
	}
	pts := make(plotter.XYs, len(c.epochs))
	for i, e := range c.epochs {
		pts[i] = plotter.XY{X: float64(e.Step), Y: e.Throughput}
	}
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return nil, err
	}
	p.Add(l, s)
	p.Legend.Add("per epoch", l, s)
	p.Y.Min = 0
	return p, nil
}

func newPanel(title, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = yLabel
	p.Legend.Top = true
	return p
}

// addLines draws each step's value faint and its moving average solid.
func addLines(p *plot.Plot, raw, smooth plotter.XYs) error {
	r, err := plotter.NewLine(raw)
	if err != nil {
		return err
	}
	r.Color = color.Gray{Y: 200}
	s, err := plotter.NewLine(smooth)
	if err != nil {
		return err
	}
	s.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	s.Width = vg.Points(1.5)
	p.Add(r, s)
	p.Legend.Add("train (per step)", r)
	p.Legend.Add("train (smoothed)", s)
	return nil
}

// addEpochs marks each epoch's train and test results at its last step.
func (c *curves) addEpochs(loss, acc *plot.Plot) error {
	if len(c.epochs) == 0 {
		return nil
	}
	points := func(p *plot.Plot, name string, dashed bool, y func(trainer.EpochMetrics) float64) error {
		pts := make(plotter.XYs, len(c.epochs))
		for i, e := range c.epochs {
			pts[i] = plotter.XY{X: float64(e.Step), Y: y(e)}
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l, s)
		p.Legend.Add(name, l, s)
		return nil
	}
	if err := points(loss, "train (epoch)", false, func(e trainer.EpochMetrics) float64 { return e.TrainLoss }); err != nil {
		return err
	}
	if err := points(acc, "train (epoch)", false, func(e trainer.EpochMetrics) float64 { return 100 * e.TrainAcc }); err != nil {
		return err
	}
	if !c.epochs[len(c.epochs)-1].Tested {
		return nil
	}
	if err := points(loss, "test (epoch)", true, func(e trainer.EpochMetrics) float64 { return e.TestLoss }); err != nil {
		return err
	}
	return points(acc, "test (epoch)", true, func(e trainer.EpochMetrics) float64 { return 100 * e.TestAcc })
}
