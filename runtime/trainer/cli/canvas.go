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

// grid splits the canvas into rows x cols cells, listed row by row from
// the top left.
func (c *canvas) grid(rows, cols int) []draw.Canvas {
	w := (c.dc.Max.X - c.dc.Min.X) / vg.Length(cols)
	h := (c.dc.Max.Y - c.dc.Min.Y) / vg.Length(rows)
	var cells []draw.Canvas
	for r := 0; r < rows; r++ {
		for k := 0; k < cols; k++ {
			cell := c.dc
			cell.Min.X = c.dc.Min.X + vg.Length(k)*w
			cell.Max.X = cell.Min.X + w
			cell.Max.Y = c.dc.Max.Y - vg.Length(r)*h // drawing's Y points up
			cell.Min.Y = cell.Max.Y - h
			cells = append(cells, cell)
		}
	}
	return cells
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
