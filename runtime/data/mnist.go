package data

// MNIST IDX files (optionally gzipped). See doc.go for the package design.
//
// A header's counts are never trusted for a size: before anything is
// allocated, the bytes they announce are checked against the file's real
// size (exactly, as torchvision's reader does, for a plain file; against
// the most a gzip file of that size can expand to otherwise), and only
// regular files are read.

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/cnnc/cnnc/runtime/regularfile"
)

// IDX magic numbers: unsigned byte data with 3 (images) or 1 (labels) dims.
const (
	idxImagesMagic = 0x00000803
	idxLabelsMagic = 0x00000801
)

// maxDeflateRatio is the most a deflate stream expands: a 258-byte match
// coded in 2 bits.
const maxDeflateRatio = 1032

// Images is a set of uint8 grayscale images of one size.
type Images struct {
	N, H, W int
	Pixels  []uint8 // N*H*W, row-major
}

// Image returns image i's pixels.
func (im *Images) Image(i int) []uint8 { return im.Pixels[i*im.H*im.W : (i+1)*im.H*im.W] }

// idxFile is an open IDX file: its (decompressed) stream and what bounds
// the data it can hold.
type idxFile struct {
	path string
	f    *os.File
	r    io.Reader
	size int64 // bytes on disk
	gz   bool
}

func openIDX(path string) (*idxFile, error) {
	f, info, err := regularfile.Open(path)
	if err != nil {
		return nil, err
	}
	x := &idxFile{path: path, f: f, r: f, size: info.Size()}
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(bufio.NewReader(f))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: not a gzip file: %v", path, err)
		}
		x.r, x.gz = z, true
	}
	return x, nil
}

func (x *idxFile) Close() error { return x.f.Close() }

// header reads the magic number, then dims big-endian u32 dimensions.
func (x *idxFile) header(want uint32, kind string, dims int) ([]uint32, error) {
	var magic uint32
	if err := binary.Read(x.r, binary.BigEndian, &magic); err != nil {
		return nil, fmt.Errorf("%s: truncated IDX header: %v", x.path, err)
	}
	if magic != want {
		return nil, fmt.Errorf("%s: not an IDX %s file (magic %#08x, want %#08x)", x.path, kind, magic, want)
	}
	hdr := make([]uint32, dims)
	if err := binary.Read(x.r, binary.BigEndian, hdr); err != nil {
		return nil, fmt.Errorf("%s: truncated IDX header: %v", x.path, err)
	}
	return hdr, nil
}

// payload reads the need bytes of data that a header of hdrLen bytes
// announces for what ("60000 images"), after checking that the file can
// hold them, and checks that nothing follows them.
func (x *idxFile) payload(hdrLen, need int64, what string) ([]byte, error) {
	switch {
	case need < 0:
		return nil, fmt.Errorf("%s: implausible size of %s", x.path, what)
	case !x.gz && x.size-hdrLen < need:
		return nil, fmt.Errorf("%s: file ends before its %s: the header announces %d bytes of data, the file holds %d", x.path, what, need, x.size-hdrLen)
	case !x.gz && x.size-hdrLen > need:
		return nil, fmt.Errorf("%s: %d bytes follow its %s: the header announces %d bytes of data, the file holds %d (a wrong count, or not an IDX file)", x.path, x.size-hdrLen-need, what, need, x.size-hdrLen)
	case x.gz && need > maxDeflateRatio*x.size:
		return nil, fmt.Errorf("%s: the header announces %s (%d bytes), more than a %d-byte gzip file can hold", x.path, what, need, x.size)
	case need > math.MaxInt:
		return nil, fmt.Errorf("%s: %s (%d bytes) do not fit in memory", x.path, what, need)
	}
	buf := make([]byte, need)
	if _, err := io.ReadFull(x.r, buf); err != nil {
		return nil, fmt.Errorf("%s: file ends before its %s: %v", x.path, what, err)
	}
	var one [1]byte
	if n, err := io.ReadFull(x.r, one[:]); n != 0 {
		return nil, fmt.Errorf("%s: data follows its %s (a wrong count, or not an IDX file)", x.path, what)
	} else if err != io.EOF {
		return nil, fmt.Errorf("%s: after its %s: %v", x.path, what, err)
	}
	return buf, nil
}

// ReadIDXImages reads an IDX3 image file (idx3-ubyte, or .gz).
func ReadIDXImages(path string) (*Images, error) {
	x, err := openIDX(path)
	if err != nil {
		return nil, err
	}
	defer x.Close()
	hdr, err := x.header(idxImagesMagic, "image", 3)
	if err != nil {
		return nil, err
	}
	n, h, w := int64(hdr[0]), int64(hdr[1]), int64(hdr[2])
	// each side bounded before the product (2^32 x 2^32 overflows)
	if n <= 0 || h <= 0 || w <= 0 || h > 1<<24 || w > 1<<24 || h*w > 1<<24 || n > 1<<28 {
		return nil, fmt.Errorf("%s: implausible IDX dimensions %dx%dx%d", path, n, h, w)
	}
	pix, err := x.payload(16, n*h*w, fmt.Sprintf("%d images", n))
	if err != nil {
		return nil, err
	}
	return &Images{N: int(n), H: int(h), W: int(w), Pixels: pix}, nil
}

// ReadIDXLabels reads an IDX1 label file (idx1-ubyte, or .gz).
func ReadIDXLabels(path string) ([]uint8, error) {
	x, err := openIDX(path)
	if err != nil {
		return nil, err
	}
	defer x.Close()
	hdr, err := x.header(idxLabelsMagic, "label", 1)
	if err != nil {
		return nil, err
	}
	n := int64(hdr[0])
	if n > 1<<28 {
		return nil, fmt.Errorf("%s: implausible label count %d", path, n)
	}
	return x.payload(8, n, fmt.Sprintf("%d labels", n))
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
