// Command mnistpng writes the first N MNIST test digits (from the GoMNIST
// module) as 8-bit grayscale PNG files named by their index and label,
// DIR/0000_is_7.png, ...: image files for `make demo` to predict, since
// MNIST itself is IDX, not images.
//
//	go run ./scripts/mnistpng DIR [N]
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
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: mnistpng DIR [N]")
		os.Exit(2)
	}
	n := 5
	if len(os.Args) == 3 {
		var err error
		if n, err = strconv.Atoi(os.Args[2]); err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "mnistpng: N %q: want a count of at least 1\n", os.Args[2])
			os.Exit(2)
		}
	}
	src, err := datasets.MNISTDir()
	if err == nil {
		err = writeDigits(src, os.Args[1], n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mnistpng:", err)
		os.Exit(1)
	}
}

// writeDigits writes the first n t10k digits of the MNIST folder src
// into dir (created if need be) and returns the first error.
func writeDigits(src, dir string, n int) error {
	ds, err := data.LoadMNIST(src, "t10k")
	if err != nil {
		return err
	}
	if n > ds.Len() {
		return fmt.Errorf("the test set has %d digits, not %d", ds.Len(), n)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		img := &image.Gray{Pix: ds.Images.Image(i), Stride: ds.Images.W, Rect: image.Rect(0, 0, ds.Images.W, ds.Images.H)}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%04d_is_%d.png", i, ds.Labels[i])))
		if err != nil {
			return err
		}
		if err := png.Encode(f, img); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}
