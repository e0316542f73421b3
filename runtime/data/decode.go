package data

// Decoding an image file and converting it to the model's channels the way
// PIL's convert("RGB") / convert("L") would, for every pixel layout Go's
// decoders return. Where Go's decoders and PIL's (libjpeg, libwebp) differ,
// the difference is documented in docs/architecture.md ("Data loading").

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	_ "image/gif" // registers GIF with image.Decode
	"image/jpeg"
	"image/png"
	"strings"

	_ "golang.org/x/image/bmp"  // registers BMP
	_ "golang.org/x/image/tiff" // registers TIFF
	_ "golang.org/x/image/webp" // registers WebP
)

// imageExtensions are the file name endings (compared in lower case) read
// as images, like torchvision's IMG_EXTENSIONS plus GIF. The decoder is
// chosen by the file's content, as PIL does, not by its extension.
var imageExtensions = map[string]bool{
	".jpg": true, ".jpeg": true, ".png": true, ".gif": true, ".bmp": true,
	".webp": true, ".tif": true, ".tiff": true,
	// torchvision reads these too; we have no decoder, so they are reported
	// as bad files rather than silently left out of the data set.
	".ppm": true, ".pgm": true,
}

// decodeResized turns an image file's bytes into the pixels a sample
// serves: decoded, converted to shape.C channels and resized to shape, after
// inspectImage has checked from the header that this is within maxBytes.
func decodeResized(encoded []byte, shape Shape, maxBytes int64) ([]uint8, error) {
	p, err := inspectImage(encoded, shape, maxBytes)
	if err != nil {
		return nil, err
	}
	return p.decodeResized(encoded, shape)
}

func (p imagePlan) decodeResized(encoded []byte, shape Shape) ([]uint8, error) {
	pix, w, h, err := p.decode(encoded, shape.C)
	if err != nil {
		return nil, err
	}
	return resizeBilinear(pix, w, h, shape.C, shape.W, shape.H), nil
}

// decodeImage decodes an encoded image and converts it to channels (1 or 3)
// at its own size: HWC pixels, width, height.
func decodeImage(encoded []byte, channels int) (pix []uint8, w, h int, err error) {
	p, err := inspectImage(encoded, Shape{C: channels}, maxDecodeBytes)
	if err != nil {
		return nil, 0, 0, err
	}
	return p.decode(encoded, channels)
}

// decode decodes an image inspectImage has planned.
func (p imagePlan) decode(encoded []byte, channels int) (pix []uint8, w, h int, err error) {
	img, format, err := image.Decode(newPeekReader(encoded))
	if err != nil {
		return nil, 0, 0, describeDecodeError(err, format)
	}
	if b := img.Bounds(); format != p.format || int64(b.Dx())*int64(b.Dy()) > int64(p.w)*int64(p.h) {
		// the decoder read the header differently from DecodeConfig
		return nil, 0, 0, fmt.Errorf("corrupt image: %s header says %dx%d, its data %dx%d", strings.ToUpper(p.format), p.w, p.h, b.Dx(), b.Dy())
	}
	if format == "gif" {
		img = withGIFTransparentColour(img, encoded)
	}
	pix, w, h = convertChannels(img, channels, format)
	return pix, w, h, nil
}

func describeDecodeError(err error, format string) error {
	if errors.Is(err, image.ErrFormat) {
		return errors.New("not a JPEG, PNG, GIF, BMP, WebP or TIFF image")
	}
	var fe jpeg.FormatError
	var ue jpeg.UnsupportedError
	var pfe png.FormatError
	switch {
	case errors.As(err, &fe), errors.As(err, &pfe):
		return fmt.Errorf("corrupt image: %v", err)
	case errors.As(err, &ue):
		return fmt.Errorf("unsupported image: %v", err)
	}
	if format != "" {
		return fmt.Errorf("cannot decode %s image: %v", strings.ToUpper(format), err)
	}
	return fmt.Errorf("cannot decode image: %v", err)
}

// grayFromRGB is PIL's convert("L"): L = R*299/1000 + G*587/1000 +
// B*114/1000, computed as Pillow does in 16-bit fixed point with rounding.
func grayFromRGB(r, g, b uint8) uint8 {
	return uint8((uint32(r)*19595 + uint32(g)*38470 + uint32(b)*7471 + 0x8000) >> 16)
}

// pixelWriter stores pixels of one HWC image in the wanted channel count.
type pixelWriter struct {
	pix      []uint8
	channels int
}

func (p *pixelWriter) rgb(i int, r, g, b uint8) {
	if p.channels == 1 {
		p.pix[i] = grayFromRGB(r, g, b)
		return
	}
	p.pix[3*i], p.pix[3*i+1], p.pix[3*i+2] = r, g, b
}

func (p *pixelWriter) gray(i int, l uint8) {
	if p.channels == 1 {
		p.pix[i] = l
		return
	}
	p.pix[3*i], p.pix[3*i+1], p.pix[3*i+2] = l, l, l
}

// unpremultiply recovers a straight 8-bit colour value from a premultiplied
// 16-bit one. Fully transparent pixels have lost their colour: they become
// black (PIL would have kept it, but Go's decoders hand such images over
// already premultiplied).
func unpremultiply(v, a uint32) uint8 {
	if a == 0 {
		return 0
	}
	if a == 0xffff {
		return uint8(v >> 8)
	}
	return uint8((v * 0xffff / a) >> 8)
}

// convertChannels converts a decoded image to HWC uint8 with 1 or 3
// channels. format ("jpeg", "webp", ...) picks how YCbCr becomes RGB: the
// way libjpeg-turbo or libwebp, which PIL uses, would do it. Alpha is dropped (not composited), as PIL's convert("RGB")
// does. 16-bit samples keep their high byte: that is what Pillow does for
// 16-bit RGB(A) PNGs; for 16-bit grayscale Pillow clamps to 255 instead,
// which turns almost every pixel white, so we deliberately differ there.
func convertChannels(img image.Image, channels int, format string) (pix []uint8, w, h int) {
	b := img.Bounds()
	w, h = b.Dx(), b.Dy()
	out := pixelWriter{pix: make([]uint8, w*h*channels), channels: channels}
	switch m := img.(type) {
	case *image.Gray:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+w]
			for x, l := range row {
				out.gray(y*w+x, l)
			}
		}
	case *image.Gray16:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+2*w]
			for x := range w {
				out.gray(y*w+x, row[2*x]) // big-endian: the high byte
			}
		}
	case *image.NRGBA:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+4*w]
			for x := range w {
				out.rgb(y*w+x, row[4*x], row[4*x+1], row[4*x+2])
			}
		}
	case *image.NRGBA64:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+8*w]
			for x := range w {
				out.rgb(y*w+x, row[8*x], row[8*x+2], row[8*x+4])
			}
		}
	case *image.RGBA:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+4*w]
			for x := range w {
				r, g, bl, a := row[4*x], row[4*x+1], row[4*x+2], row[4*x+3]
				if a != 255 {
					a16 := uint32(a) * 0x101
					r = unpremultiply(uint32(r)*0x101, a16)
					g = unpremultiply(uint32(g)*0x101, a16)
					bl = unpremultiply(uint32(bl)*0x101, a16)
				}
				out.rgb(y*w+x, r, g, bl)
			}
		}
	case *image.RGBA64:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+8*w]
			for x := range w {
				px := row[8*x : 8*x+8]
				a := uint32(px[6])<<8 | uint32(px[7])
				if a == 0xffff {
					out.rgb(y*w+x, px[0], px[2], px[4])
					continue
				}
				out.rgb(y*w+x,
					unpremultiply(uint32(px[0])<<8|uint32(px[1]), a),
					unpremultiply(uint32(px[2])<<8|uint32(px[3]), a),
					unpremultiply(uint32(px[4])<<8|uint32(px[5]), a))
			}
		}
	case *image.Paletted:
		// Convert the palette once (a GIF's transparent entry has had its
		// colour restored by decodeImage).
		var lut [256][3]uint8
		for i, c := range m.Palette {
			lut[i] = straightRGB(c)
		}
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+w]
			for x, idx := range row {
				c := lut[idx]
				out.rgb(y*w+x, c[0], c[1], c[2])
			}
		}
	case *image.YCbCr:
		convertYCbCr(m, &out, format)
	case *image.NYCbCrA:
		convertYCbCr(&m.YCbCr, &out, format)
	case *image.CMYK:
		for y := range h {
			row := m.Pix[y*m.Stride : y*m.Stride+4*w]
			for x := range w {
				r, g, bl := cmykToRGB(row[4*x], row[4*x+1], row[4*x+2], row[4*x+3])
				out.rgb(y*w+x, r, g, bl)
			}
		}
	default:
		for y := range h {
			for x := range w {
				c := straightRGB(img.At(b.Min.X+x, b.Min.Y+y))
				out.rgb(y*w+x, c[0], c[1], c[2])
			}
		}
	}
	return out.pix, w, h
}

// straightRGB returns a colour's non-premultiplied 8-bit RGB.
func straightRGB(c color.Color) [3]uint8 {
	switch c := c.(type) {
	case color.NRGBA:
		return [3]uint8{c.R, c.G, c.B}
	case color.RGBA:
		if c.A == 255 {
			return [3]uint8{c.R, c.G, c.B}
		}
	case color.Gray:
		return [3]uint8{c.Y, c.Y, c.Y}
	}
	n := color.NRGBAModel.Convert(c).(color.NRGBA)
	return [3]uint8{n.R, n.G, n.B}
}

// convertYCbCr converts a JPEG or WebP image's YCbCr planes to RGB as
// PIL's decoders do: chroma upsampled with libjpeg-turbo's or libwebp's
// "fancy" (triangle) filter, then their fixed-point colour conversion:
// full-range JFIF for JPEG, limited-range BT.601 for WebP. Go's own
// YCbCr.At takes the nearest chroma sample, which on colour edges is
// tens of levels off what PyTorch pipelines see.
func convertYCbCr(m *image.YCbCr, out *pixelWriter, format string) {
	b := m.Rect
	w, h := b.Dx(), b.Dy()
	toRGB := yccConverter(format)
	hs, vs := 1, 1
	switch m.SubsampleRatio {
	case image.YCbCrSubsampleRatio422:
		hs = 2
	case image.YCbCrSubsampleRatio420:
		hs, vs = 2, 2
	case image.YCbCrSubsampleRatio440:
		vs = 2
	}
	if b.Min != (image.Point{}) || m.SubsampleRatio == image.YCbCrSubsampleRatio411 || m.SubsampleRatio == image.YCbCrSubsampleRatio410 {
		// Sub-images, and 4:1:1 / 4:1:0, which libjpeg upsamples by
		// replication too: the nearest chroma sample.
		for y := range h {
			for x := range w {
				ci := m.COffset(b.Min.X+x, b.Min.Y+y)
				r, g, bl := toRGB(m.Y[m.YOffset(b.Min.X+x, b.Min.Y+y)], m.Cb[ci], m.Cr[ci])
				out.rgb(y*w+x, r, g, bl)
			}
		}
		return
	}
	up := chromaUpsampler{m: m, w: w, h: h, hs: hs, vs: vs, webp: format == "webp"}
	cb, cr := make([]uint8, w), make([]uint8, w)
	for y := range h {
		up.row(m.Cb, y, cb)
		up.row(m.Cr, y, cr)
		yrow := m.Y[y*m.YStride : y*m.YStride+w]
		for x, yy := range yrow {
			r, g, bl := toRGB(yy, cb[x], cr[x])
			out.rgb(y*w+x, r, g, bl)
		}
	}
}

// chromaUpsampler produces full-resolution chroma rows. For a luma pixel,
// "near" is the chroma sample covering it and "far" the neighbour on the
// side it leans to (clamped at the edges, as libjpeg replicates edges).
type chromaUpsampler struct {
	m      *image.YCbCr
	w, h   int
	hs, vs int
	webp   bool
	colsum []int
}

func (u *chromaUpsampler) row(plane []uint8, y int, dst []uint8) {
	cw, ch := (u.w+u.hs-1)/u.hs, (u.h+u.vs-1)/u.vs
	stride := u.m.CStride
	near := plane[(y/u.vs)*stride : (y/u.vs)*stride+cw]
	far := near
	if u.vs == 2 {
		fr := clampIndex(y/2+2*(y%2)-1, ch)
		far = plane[fr*stride : fr*stride+cw]
	}
	switch {
	case u.webp:
		// libwebp's UpsampleRgbLinePair: the 9-3-3-1 weights in two
		// rounded steps; vertical only at the left and (even width)
		// right edges.
		for x := range u.w {
			a := x / 2
			nn, fn := int(near[a]), int(far[a])
			if x == 0 || (x == u.w-1 && u.w%2 == 0) {
				dst[x] = uint8((3*nn + fn + 2) >> 2)
				continue
			}
			bb := a + 2*(x%2) - 1 // always inside here
			nf, ff := int(near[bb]), int(far[bb])
			dst[x] = uint8((((nn + 3*nf + 3*fn + ff + 8) >> 3) + nn) >> 1)
		}
	case u.hs == 2 && u.vs == 2:
		// libjpeg's h2v2_fancy_upsample: vertical 3:1 column sums, then
		// horizontal 3:1 with alternating rounding.
		if cap(u.colsum) < cw {
			u.colsum = make([]int, cw)
		}
		cs := u.colsum[:cw]
		for c := range cs {
			cs[c] = 3*int(near[c]) + int(far[c])
		}
		for x := range u.w {
			a := x / 2
			bb := clampIndex(a+2*(x%2)-1, cw)
			dst[x] = uint8((3*cs[a] + cs[bb] + 8 - x%2) >> 4)
		}
	case u.hs == 2: // h2v1_fancy_upsample
		for x := range u.w {
			a := x / 2
			bb := clampIndex(a+2*(x%2)-1, cw)
			dst[x] = uint8((3*int(near[a]) + int(near[bb]) + 1 + x%2) >> 2)
		}
	case u.vs == 2: // h1v2_fancy_upsample
		for x := range u.w {
			dst[x] = uint8((3*int(near[x]) + int(far[x]) + 1 + y%2) >> 2)
		}
	default:
		copy(dst, near[:u.w])
	}
}

func clampIndex(i, n int) int { return min(max(i, 0), n-1) }

// yccTables hold libjpeg's (jdcolor.c) and libwebp's (yuv.h) fixed-point
// YCbCr -> RGB terms, indexed by the 8-bit sample.
var yccTables = func() (t struct {
	jpegCrR, jpegCbB, jpegCbG, jpegCrG        [256]int
	webpY, webpCrR, webpCbG, webpCrG, webpCbB [256]int
}) {
	const half = 1 << 15
	mulHi := func(v, c int) int { return (v * c) >> 8 }
	for i := range 256 {
		x := i - 128
		t.jpegCrR[i] = (91881*x + half) >> 16
		t.jpegCbB[i] = (116130*x + half) >> 16
		t.jpegCbG[i] = -22554*x + half
		t.jpegCrG[i] = -46802 * x
		t.webpY[i] = mulHi(i, 19077)
		t.webpCrR[i] = mulHi(i, 26149) - 14234
		t.webpCbG[i] = -mulHi(i, 6419)
		t.webpCrG[i] = -mulHi(i, 13320) + 8708
		t.webpCbB[i] = mulHi(i, 33050) - 17685
	}
	return t
}()

// yccConverter returns the YCbCr -> RGB conversion of libjpeg (format
// "jpeg"), libwebp ("webp") or, for anything else, Go's JFIF one.
func yccConverter(format string) func(y, cb, cr uint8) (r, g, b uint8) {
	t := &yccTables
	switch format {
	case "jpeg":
		return func(y, cb, cr uint8) (uint8, uint8, uint8) {
			yy := int(y)
			return clip255(yy + t.jpegCrR[cr]), clip255(yy + (t.jpegCbG[cb]+t.jpegCrG[cr])>>16), clip255(yy + t.jpegCbB[cb])
		}
	case "webp":
		return func(y, cb, cr uint8) (uint8, uint8, uint8) {
			yy := t.webpY[y]
			return webpClip(yy + t.webpCrR[cr]), webpClip(yy + t.webpCbG[cb] + t.webpCrG[cr]), webpClip(yy + t.webpCbB[cb])
		}
	}
	return color.YCbCrToRGB
}

func clip255(v int) uint8 { return uint8(min(max(v, 0), 255)) }

// webpClip turns libwebp's 6-fraction-bit value into a pixel.
func webpClip(v int) uint8 {
	if v&^(256<<6-1) == 0 {
		return uint8(v >> 6)
	}
	if v < 0 {
		return 0
	}
	return 255
}

// cmykToRGB is Pillow's CMYK -> RGB conversion: each channel is
// (255-K) - C*(255-K)/255, the product rounded as Pillow's MULDIV255 does.
func cmykToRGB(c, m, y, k uint8) (r, g, b uint8) {
	nk := 255 - int(k)
	conv := func(v uint8) uint8 {
		t := int(v)*nk + 128
		return uint8(nk - ((t>>8)+t)>>8)
	}
	return conv(c), conv(m), conv(y)
}
