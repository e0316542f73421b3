package data

import (
	"image"
	"image/color"
)

// gifTransparentColour returns the first frame's transparent index and
// the colour its colour table gives it, which Go's GIF decoder replaces with
// transparent black before the image is returned. PIL keeps it:
// convert("RGB") of a GIF shows the table's colour where the frame is
// transparent, so the loader puts it back (withGIFTransparentColour).
// ok is false when the frame has no transparent index or the stream
// cannot be read that far (the decoder has judged the file already).
func gifTransparentColour(b []byte) (index int, c color.RGBA, ok bool) {
	if len(b) < 13 || string(b[:3]) != "GIF" {
		return 0, c, false
	}
	table := func(packed byte, at int) ([]byte, int) {
		if packed&0x80 == 0 {
			return nil, at
		}
		n := 3 << ((packed & 7) + 1)
		if at+n > len(b) {
			return nil, len(b)
		}
		return b[at : at+n], at + n
	}
	global, i := table(b[10], 13)
	transparent := -1
	for i < len(b) {
		switch b[i] {
		case 0x21: // extension: label, then data sub-blocks
			if i+1 >= len(b) {
				return 0, c, false
			}
			label := b[i+1]
			i += 2
			if label == 0xF9 && i+5 < len(b) && b[i] == 4 {
				transparent = -1
				if b[i+1]&1 != 0 {
					transparent = int(b[i+4])
				}
			}
			for i < len(b) && b[i] != 0 {
				i += int(b[i]) + 1
			}
			i++ // the block terminator
		case 0x2C: // the first image descriptor: its local table, else the global one
			if i+10 > len(b) || transparent < 0 {
				return 0, c, false
			}
			local, _ := table(b[i+9], i+10)
			t := global
			if local != nil {
				t = local
			}
			if 3*transparent+3 > len(t) {
				return 0, c, false
			}
			return transparent, color.RGBA{t[3*transparent], t[3*transparent+1], t[3*transparent+2], 255}, true
		default: // the trailer, or not a GIF stream
			return 0, c, false
		}
	}
	return 0, c, false
}

// withGIFTransparentColour gives a decoded GIF frame's transparent
// palette entry the colour its file stores (see gifTransparentColour).
func withGIFTransparentColour(img image.Image, encoded []byte) image.Image {
	m, ok := img.(*image.Paletted)
	if !ok {
		return img
	}
	i, c, ok := gifTransparentColour(encoded)
	if !ok || i >= len(m.Palette) {
		return img
	}
	pal := append(color.Palette(nil), m.Palette...)
	pal[i] = c
	cp := *m
	cp.Palette = pal
	return &cp
}
