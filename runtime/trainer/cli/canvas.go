package cli

import (
	"os"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// canvas wraps a PNG or SVG drawing surface.
type canvas struct {
	c  vg.CanvasWriterTo
	dc draw.Canvas
}

func newCanvas(ext string, w, h vg.Length) (*canvas, error) {
	var c vg.CanvasWriterTo
	if ext == ".svg" {
		c = vgsvg.New(w, h)
	} else {
		c = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	}
	return &canvas{c: c, dc: draw.New(c)}, nil
}

func (c *canvas) splitHorizontally() (draw.Canvas, draw.Canvas) {
	mid := (c.dc.Min.X + c.dc.Max.X) / 2
	left, right := c.dc, c.dc
	left.Max.X = mid
	right.Min.X = mid
	return left, right
}

// save writes the image atomically enough for a figure: a temp file renamed.
func (c *canvas) save(path string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := c.c.WriteTo(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
