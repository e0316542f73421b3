package data

// What decoding one image may cost, known before it is decoded.
//
// An image file's header says how large the image is; decoders allocate
// the whole image as soon as they have read it, before any pixel data. So
// a file of a few bytes whose header claims a huge image would make them
// allocate gigabytes. inspectImage reads the header first (the decoders'
// DecodeConfig) and refuses, before anything is allocated:
//
//   - an image of more than maxImagePixels pixels (PIL refuses those too);
//   - an image larger than its file can encode: PNG data is deflate (at
//     most 1032 bytes out per byte in), BMP data is uncompressed (at least
//     one bit per pixel), a GIF frame is LZW (codes of at least 3 bits,
//     each at most 4096 pixels), a JPEG needs at least one bit per 8x8
//     block of the component of its first scan (subsampled 4x4 at most).
//     WebP (lossless can spend no bits on a pixel) and TIFF (strips may
//     share bytes, CCITT fax codes whole rows in a bit) have no such
//     bound;
//   - a TIFF whose directory, tags or blocks lie beyond the file
//     (checkTIFFOffsets, checkTIFFBlocks);
//   - an image whose decoding, channel conversion and resizing together
//     would allocate more than maxDecodeBytes, estimated from the format,
//     the pixel layout and the sizes (FuzzDecodeImage checks that the
//     estimate bounds what is really allocated).
//
// Decoding workers then share a memoryGate of maxDecodeBytes, so that all
// images being decoded at once stay within it too.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image"
	"image/color"
	"io"
	"math"
	"strings"
	"sync"
)

const (
	// maxImagePixels guards against decompression bombs: twice PIL's
	// MAX_IMAGE_PIXELS, the size at which PIL refuses to open an image.
	maxImagePixels = 2 * 89478485
	// maxImageFileBytes bounds an image file's size: a file that big
	// could only hold an image decoding would refuse anyway.
	maxImageFileBytes = 512 << 20
	// maxDecodeBytes bounds the estimated memory of decoding one image,
	// and of all images being decoded at once.
	maxDecodeBytes = 2 << 30
	// decodeSlack covers decoders' fixed allocations (tables, buffers).
	decodeSlack = 1 << 20
)

// vp8lGroupTableBytes is x/image/vp8l's largest table of Huffman groups:
// 65536 groups of five trees, each with a 128-entry lookup table.
//
// Not counted: the trees themselves. A crafted lossless WebP can describe
// a valid 2048-symbol tree in about 20 bits, for which the decoder keeps
// 32 KiB of nodes: 65536 groups of such trees, about 1 MB of file, make it
// keep about 3 GB (counted from its code, not measured). Bounding that
// needs the decoder's own checks (libwebp allows no more groups than the
// meta image has tiles); the memory gate does not see it, and
// FuzzDecodeImage allows for it.
const vp8lGroupTableBytes = 65536 * 5 * (24 + 128*4)

// Minimum encoded bits per pixel, as "pixels per encoded byte" (see above).
const (
	pngMaxRatio  = 1032 // deflate: output bytes per input byte
	gifMaxPixels = 4096 * 8 / 3
	jpegMaxPixel = 64 * 16 * 8 // a block of a component subsampled up to 4x4
	bmpMaxPixel  = 8
)

// imagePlan is what inspectImage learned from an image's header.
type imagePlan struct {
	format string // "png", "jpeg", ... as image.DecodeConfig names it
	w, h   int
	cost   int64 // bytes decoding, converting and resizing allocate, at most
}

// inspectImage reads an encoded image's header and works out what decoding
// it, converting it to out.C channels and resizing it to out.H x out.W
// (none when out.H or out.W is 0) will allocate; it refuses what the
// header cannot legitimately describe or what would cost more than
// maxBytes.
func inspectImage(encoded []byte, out Shape, maxBytes int64) (imagePlan, error) {
	if err := checkTIFFOffsets(encoded); err != nil {
		return imagePlan{}, err
	}
	if err := checkTIFFBlocks(encoded); err != nil {
		return imagePlan{}, err
	}
	cfg, format, err := image.DecodeConfig(newPeekReader(encoded))
	if err != nil {
		return imagePlan{}, describeDecodeError(err, format)
	}
	p := imagePlan{format: format, w: cfg.Width, h: cfg.Height}
	name := strings.ToUpper(format)
	if p.w <= 0 || p.h <= 0 {
		return p, fmt.Errorf("%s image has no pixels (%dx%d)", name, p.w, p.h)
	}
	pixels := int64(p.w) * int64(p.h) // both < 2^31: no overflow
	if pixels > maxImagePixels {
		return p, fmt.Errorf("%s image of %dx%d pixels is larger than %d pixels (a decompression bomb?)", name, p.w, p.h, maxImagePixels)
	}
	if err := checkEncodable(format, encoded, p.w, p.h); err != nil {
		return p, err
	}
	if out.H == 0 || out.W == 0 {
		out.H, out.W = p.h, p.w
	}
	p.cost = decoderBytes(format, cfg, encoded) + pixels*int64(out.C) + resizeBytes(p.w, p.h, out) + decodeSlack
	if p.cost > maxBytes {
		return p, fmt.Errorf("decoding this %dx%d %s image would take about %d MiB of memory, more than the %d MiB one image may use", p.w, p.h, name, p.cost>>20, maxBytes>>20)
	}
	return p, nil
}

// peekReader is a bytes.Reader with Peek, which image.Decode and
// image.DecodeConfig then hand to the format's decoder as it is instead of
// wrapping it in a bufio.Reader. It matters for TIFF: given a reader
// without ReadAt, x/image/tiff reads through a buffer that it grows to any
// offset a header names — gigabytes for a file of a few bytes; given a
// ReaderAt, it reads at the offsets, and one past the end is an error.
type peekReader struct {
	*bytes.Reader
	b []byte
}

func newPeekReader(b []byte) peekReader { return peekReader{bytes.NewReader(b), b} }

func (p peekReader) Peek(n int) ([]byte, error) {
	off := len(p.b) - p.Len()
	if n > p.Len() {
		return p.b[off:], io.EOF
	}
	return p.b[off : off+n], nil
}

// tiffTypeSizes are the element sizes of the TIFF field types x/image/tiff
// reads (BYTE, ASCII, SHORT, LONG, RATIONAL).
var tiffTypeSizes = [...]uint64{0, 1, 1, 2, 4, 8}

// checkTIFFOffsets refuses a TIFF whose first directory, or the data of one
// of its tags, lies beyond the file. x/image/tiff allocates what a tag
// claims (up to 10 MiB per tag, and eight bytes per value on top) before
// finding out that the file ends first.
func checkTIFFOffsets(b []byte) error {
	var bo binary.ByteOrder
	switch {
	case len(b) < 8:
		return nil // the decoder judges
	case string(b[:4]) == "II*\x00":
		bo = binary.LittleEndian
	case string(b[:4]) == "MM\x00*":
		bo = binary.BigEndian
	default:
		return nil
	}
	n := uint64(len(b))
	ifd := uint64(bo.Uint32(b[4:]))
	if ifd+2 > n || ifd+2+12*uint64(bo.Uint16(b[ifd:])) > n {
		return fmt.Errorf("corrupt image: its TIFF directory lies beyond the file's %d bytes", n)
	}
	for i := range uint64(bo.Uint16(b[ifd:])) {
		e := b[ifd+2+12*i:]
		typ, count := bo.Uint16(e[2:]), uint64(bo.Uint32(e[4:]))
		if int(typ) >= len(tiffTypeSizes) {
			continue
		}
		if size := tiffTypeSizes[typ] * count; size > 4 && uint64(bo.Uint32(e[8:]))+size > n {
			return fmt.Errorf("corrupt image: its TIFF tag %d claims %d bytes beyond the file's %d", bo.Uint16(e), size, n)
		}
	}
	return nil
}

// checkEncodable refuses a w x h image (or first frame, for a GIF) that
// is larger than the encoded bytes can hold in a format with a minimum
// cost per pixel.
func checkEncodable(format string, b []byte, w, h int) error {
	n, pixels := int64(len(b)), int64(w)*int64(h)
	most := int64(math.MaxInt64)
	switch format {
	case "png":
		if bits := pngBitsPerPixel(b); bits > 0 {
			most = n * pngMaxRatio * 8 / bits
		}
	case "bmp":
		most = n * bmpMaxPixel
	case "jpeg":
		most = n * jpegMaxPixel
	case "gif":
		if fr, ok := gifFirstFrame(b); ok {
			// the first frame is what is decoded, not the logical screen
			w, h, pixels = fr.w, fr.h, int64(fr.w)*int64(fr.h)
			most = n * gifMaxPixels
		}
	}
	if pixels > most {
		return fmt.Errorf("corrupt image: its %s header claims %dx%d pixels, more than its %d bytes can encode", strings.ToUpper(format), w, h, n)
	}
	return nil
}

// pngBitsPerPixel reads IHDR's bit depth and colour type (DecodeConfig has
// checked them); 0 if the bytes are not there.
func pngBitsPerPixel(b []byte) int64 {
	if len(b) < 29 || string(b[12:16]) != "IHDR" {
		return 0
	}
	channels := map[byte]int64{0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[b[25]]
	return int64(b[24]) * channels
}

// decoderBytes is what the format's decoder allocates for an image of
// cfg's size and colour model, at most.
func decoderBytes(format string, cfg image.Config, b []byte) int64 {
	w, h := int64(cfg.Width), int64(cfg.Height)
	pixels := w * h
	bpp := bytesPerPixel(cfg.ColorModel)
	switch format {
	case "png":
		// the image, twice when interlaced (each pass is decoded into its
		// own image, then copied), and two rows of filtered bytes
		n := pixels * bpp
		if len(b) > 28 && b[28] != 0 {
			n *= 2
		}
		return n + 2*(w*8+1)
	case "jpeg":
		// planes padded to whole 16x16 MCUs; a CMYK image is decoded as
		// YCbCr plus K, then converted; progressive images keep every
		// block's coefficients (64 int32s per 8x8 block) until the end
		padded := (w + 16) * (h + 16)
		comps := int64(3)
		switch cfg.ColorModel {
		case color.GrayModel:
			comps = 1
		case color.CMYKModel:
			comps = 4
		}
		n := padded * comps
		if comps == 4 {
			n += padded * 4
		}
		if !jpegBaseline(b) {
			n += padded * comps * 4
		}
		return n
	case "gif":
		return pixels // one paletted frame, at most the logical screen
	case "webp":
		// lossless: ARGB words and the NRGBA image; lossy: YCbCr planes
		// and an alpha plane that may itself be a lossless image. A
		// lossless image (VP8L, or VP8L-coded alpha) also gets a table of
		// Huffman groups sized by the largest group index its meta image
		// holds, whatever the image's size: up to 65536 groups.
		n := pixels * 8
		if bytes.Contains(b, []byte("VP8L")) || bytes.Contains(b, []byte("ALPH")) {
			n += vp8lGroupTableBytes
		}
		return n
	case "tiff":
		return pixels*bpp + tiffBlockBytes(b) // the image, and its blocks (tiff.go)
	case "bmp":
		return pixels*4 + w*4 + 4 // RGBA or paletted, and one row
	}
	return pixels * 8 // anything else: 64-bit RGBA at most
}

// bytesPerPixel is the size of a pixel of a colour model's image type.
func bytesPerPixel(m color.Model) int64 {
	switch m {
	case color.GrayModel, color.AlphaModel:
		return 1
	case color.Gray16Model, color.Alpha16Model:
		return 2
	case color.RGBAModel, color.NRGBAModel, color.CMYKModel, color.NYCbCrAModel:
		return 4
	case color.YCbCrModel:
		return 3
	}
	if _, ok := m.(color.Palette); ok {
		return 1
	}
	return 8 // RGBA64, NRGBA64 and anything unknown
}

// jpegBaseline tells whether a JPEG's frame header says baseline or
// extended sequential (SOF0/SOF1) coding; anything not found to be is
// treated as progressive.
func jpegBaseline(b []byte) bool {
	i := 2 // after SOI
	for i+4 <= len(b) {
		if b[i] != 0xFF { // junk between segments, which decoders skip
			i++
			continue
		}
		m := b[i+1]
		switch {
		case m == 0xFF:
			i++
			continue
		case m == 0x01 || (m >= 0xD0 && m <= 0xD8):
			i += 2 // markers without a length
			continue
		case m == 0xC0 || m == 0xC1:
			return true
		case m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC, m == 0xDA:
			return false
		}
		i += 2 + (int(b[i+2])<<8 | int(b[i+3]))
	}
	return false
}

// resizeBytes is what resizeBilinear allocates to take a w x h image to
// out: the horizontal pass's rows, the vertical pass's image and
// accumulators, and each axis's filter (float64 then int32 weights).
func resizeBytes(w, h int, out Shape) int64 {
	c := int64(out.C)
	ow, oh := int64(out.W), int64(out.H)
	var n int64
	if w != out.W {
		n += int64(h)*ow*c + axisBytes(w, out.W)
	}
	if h != out.H {
		n += oh*ow*c + ow*c*8 + axisBytes(h, out.H)
	}
	return n
}

func axisBytes(in, out int) int64 {
	taps := 2*int64(math.Ceil(max(float64(in)/float64(out), 1))) + 1
	return int64(out)*taps*(8+4) + int64(out)*16
}

// memoryGate lets decoding workers take turns so that the images being
// decoded at once never need more than capacity bytes. Requests are served
// in order, so a large image is not starved by a stream of small ones; a
// request larger than the capacity waits until it runs alone.
type memoryGate struct {
	mu              sync.Mutex
	cond            sync.Cond
	capacity, used  int64
	ticket, serving uint64
}

func newMemoryGate(capacity int64) *memoryGate {
	g := &memoryGate{capacity: capacity}
	g.cond.L = &g.mu
	return g
}

// acquire waits until n bytes (at most the capacity) are free and takes
// them; release(n) with the returned n gives them back.
func (g *memoryGate) acquire(n int64) int64 {
	n = min(n, g.capacity)
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.ticket
	g.ticket++
	for t != g.serving || g.used+n > g.capacity {
		g.cond.Wait()
	}
	g.serving++
	g.used += n
	g.cond.Broadcast()
	return n
}

func (g *memoryGate) release(n int64) {
	g.mu.Lock()
	g.used -= n
	g.mu.Unlock()
	g.cond.Broadcast()
}
