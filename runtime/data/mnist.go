package data

// MNIST IDX files (optionally gzipped). See doc.go for the package design.

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// IDX magic numbers: unsigned byte data with 3 (images) or 1 (labels) dims.
const (
	idxImagesMagic = 0x00000803
	idxLabelsMagic = 0x00000801
)

// Images is a set of uint8 grayscale images of one size.
type Images struct {
	N, H, W int
	Pixels  []uint8 // N*H*W, row-major
}

// Image returns image i's pixels.
func (im *Images) Image(i int) []uint8 { return im.Pixels[i*im.H*im.W : (i+1)*im.H*im.W] }

func openMaybeGzip(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: not a gzip file: %v", path, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{z, f}, nil
}

func readMagic(r io.Reader, path string, want uint32, kind string) error {
	var magic uint32
	if err := binary.Read(r, binary.BigEndian, &magic); err != nil {
		return fmt.Errorf("%s: truncated IDX header: %v", path, err)
	}
	if magic != want {
		return fmt.Errorf("%s: not an IDX %s file (magic %#08x, want %#08x)", path, kind, magic, want)
	}
	return nil
}

// ReadIDXImages reads an IDX3 image file (idx3-ubyte, or .gz).
func ReadIDXImages(path string) (*Images, error) {
	r, err := openMaybeGzip(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := readMagic(r, path, idxImagesMagic, "image"); err != nil {
		return nil, err
	}
	var hdr [3]uint32
	if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
		return nil, fmt.Errorf("%s: truncated IDX header: %v", path, err)
	}
	n, h, w := int(hdr[0]), int(hdr[1]), int(hdr[2])
	if n <= 0 || h <= 0 || w <= 0 || h*w > 1<<24 || n > 1<<28 {
		return nil, fmt.Errorf("%s: implausible IDX dimensions %dx%dx%d", path, n, h, w)
	}
	im := &Images{N: n, H: h, W: w, Pixels: make([]uint8, n*h*w)}
	if _, err := io.ReadFull(r, im.Pixels); err != nil {
		return nil, fmt.Errorf("%s: file ends before its %d images: %v", path, n, err)
	}
	return im, nil
}

// ReadIDXLabels reads an IDX1 label file (idx1-ubyte, or .gz).
func ReadIDXLabels(path string) ([]uint8, error) {
	r, err := openMaybeGzip(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := readMagic(r, path, idxLabelsMagic, "label"); err != nil {
		return nil, err
	}
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return nil, fmt.Errorf("%s: truncated IDX header: %v", path, err)
	}
	if n > 1<<28 {
		return nil, fmt.Errorf("%s: implausible label count %d", path, n)
	}
	labels := make([]uint8, n)
	if _, err := io.ReadFull(r, labels); err != nil {
		return nil, fmt.Errorf("%s: file ends before its %d labels: %v", path, n, err)
	}
	return labels, nil
}

// MNIST is one split of MNIST.
type MNIST struct {
	Images *Images
	Labels []uint8
}

// LoadMNIST reads split "train" or "t10k" from dir, which holds the four
// standard files (train-images-idx3-ubyte[.gz], ...).
func LoadMNIST(dir, split string) (*MNIST, error) {
	find := func(kind string) (string, error) {
		base := filepath.Join(dir, fmt.Sprintf("%s-%s", split, kind))
		for _, p := range []string{base, base + ".gz"} {
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
		return "", fmt.Errorf("%s: no MNIST %s file (looked for %s and %s.gz)", dir, kind, filepath.Base(base), filepath.Base(base))
	}
	ip, err := find("images-idx3-ubyte")
	if err != nil {
		return nil, err
	}
	lp, err := find("labels-idx1-ubyte")
	if err != nil {
		return nil, err
	}
	im, err := ReadIDXImages(ip)
	if err != nil {
		return nil, err
	}
	lb, err := ReadIDXLabels(lp)
	if err != nil {
		return nil, err
	}
	if len(lb) != im.N {
		return nil, fmt.Errorf("%s has %d images but %s has %d labels", ip, im.N, lp, len(lb))
	}
	for i, l := range lb {
		if l > 9 {
			return nil, fmt.Errorf("%s: label %d of sample %d is not a digit", lp, l, i)
		}
	}
	return &MNIST{Images: im, Labels: lb}, nil
}
