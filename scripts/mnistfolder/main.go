// Command mnistfolder writes MNIST digits (from the GoMNIST module) as an ImageFolder of 32x32
// RGB PNGs — DIR/train/classK/NNNNN.png from the first N training digits, DIR/test/classK/...
// from the first M test digits — data the examples with 3x32x32 inputs (vgg_small,
// mobilenet_small, resnet18) train on (`make train-examples`). Each digit is centred on a 32x32
// black canvas (2 pixels of border), its gray level v written as (v, 255-v, v/2) so the three
// channels differ.
//
//	go run ./scripts/mnistfolder DIR [N M]
package main

import (
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
)

func main() {
	if len(os.Args) != 2 && len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: mnistfolder DIR [N M]")
		os.Exit(2)
	}
	counts := []int{4096, 1024}
	if len(os.Args) == 4 {
		for i, a := range os.Args[2:] {
			n, err := strconv.Atoi(a)
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "mnistfolder: %q: want a count of at least 1\n", a)
				os.Exit(2)
			}
			counts[i] = n
		}
	}
	src, err := datasets.MNISTDir()
	for i, s := range []struct{ split, dir string }{{"train", "train"}, {"t10k", "test"}} {
		if err == nil {
			err = writeSplit(src, s.split, filepath.Join(os.Args[1], s.dir), counts[i])
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mnistfolder:", err)
		os.Exit(1)
	}
}

// writeSplit writes the first n digits of MNIST's split into root/classK/.
func writeSplit(src, split, root string, n int) error {
	ds, err := data.LoadMNIST(src, split)
	if err != nil {
		return err
	}
	if n > ds.Len() {
		return fmt.Errorf("%s has %d digits, not %d", split, ds.Len(), n)
	}
	for i := range n {
		dir := filepath.Join(root, fmt.Sprintf("class%d", ds.Labels[i]))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := writePNG(filepath.Join(dir, fmt.Sprintf("%05d.png", i)), digitRGB(ds.Images.Image(i), ds.Images.H, ds.Images.W)); err != nil {
			return err
		}
	}
	return nil
}

// digitRGB centres an h x w gray digit on a 32x32 RGB canvas.
func digitRGB(gray []byte, h, w int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, 32, 32))
	oy, ox := (32-h)/2, (32-w)/2
	for y := range 32 {
		for x := range 32 {
			var v byte
			if sy, sx := y-oy, x-ox; sy >= 0 && sy < h && sx >= 0 && sx < w {
				v = gray[sy*w+sx]
			}
			o := img.PixOffset(x, y)
			img.Pix[o], img.Pix[o+1], img.Pix[o+2], img.Pix[o+3] = v, 255-v, v/2, 255
		}
	}
	return img
}

func writePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
