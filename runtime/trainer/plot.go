package trainer

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// PlotCurves draws the loss (left) and accuracy (right) per epoch to a
// .png or .svg file.
func PlotCurves(path, model string, epochs []EpochLog) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("--plot %s: write a .png or .svg file", path)
	}
	line := func(p *plot.Plot, name string, dashed bool, y func(EpochLog) float64) error {
		pts := make(plotter.XYs, len(epochs))
		for i, e := range epochs {
			pts[i] = plotter.XY{X: float64(e.Epoch), Y: y(e)}
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
	loss := plot.New()
	loss.Title.Text = model + ": loss"
	loss.X.Label.Text = "epoch"
	loss.Y.Label.Text = "cross-entropy"
	acc := plot.New()
	acc.Title.Text = model + ": accuracy"
	acc.X.Label.Text = "epoch"
	acc.Y.Label.Text = "accuracy (%)"
	hasTest := false
	for _, e := range epochs {
		hasTest = hasTest || e.TestAcc > 0
	}
	if err := line(loss, "train", false, func(e EpochLog) float64 { return e.TrainLoss }); err != nil {
		return err
	}
	if err := line(acc, "train", false, func(e EpochLog) float64 { return 100 * e.TrainAcc }); err != nil {
		return err
	}
	if hasTest {
		if err := line(loss, "test", true, func(e EpochLog) float64 { return e.TestLoss }); err != nil {
			return err
		}
		if err := line(acc, "test", true, func(e EpochLog) float64 { return 100 * e.TestAcc }); err != nil {
			return err
		}
	}
	// two panels side by side
	const w, h = 10 * vg.Inch, 4 * vg.Inch
	img, err := newCanvas(ext, w, h)
	if err != nil {
		return err
	}
	left, right := img.splitHorizontally()
	loss.Draw(left)
	acc.Draw(right)
	return img.save(path)
}
