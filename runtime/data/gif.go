package data

import (
	"image"
	"image/color"
)

// gifFrame is what the loader needs from a GIF's first image descriptor:
// its size (decoding allocates the frame, not the logical screen), its
// transparent index (-1: none) and the colour table it uses.
type gifFrame struct {
	w, h        int
	transparent int
	table       []byte // RGB triplets
}

// gifFirstFrame walks a GIF stream's blocks to its first image
// descriptor. ok is false when the stream cannot be read that far (the
// decoder judges the file then).
func gifFirstFrame(b []byte) (fr gifFrame, ok bool) {
	if len(b) < 13 || string(b[:3]) != "GIF" {
		return fr, false
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
	fr.transparent = -1
	for i < len(b) {
		switch b[i] {
		case 0x21: // extension: label, then data sub-blocks
			if i+1 >= len(b) {
				return fr, false
			}
			label := b[i+1]
			i += 2
			if label == 0xF9 && i+5 < len(b) && b[i] == 4 {
				fr.transparent = -1
				if b[i+1]&1 != 0 {
					fr.transparent = int(b[i+4])
				}
			}
			for i < len(b) && b[i] != 0 {
				i += int(b[i]) + 1
			}
			i++ // the block terminator
		case 0x2C: // the first image descriptor: its local table, else the global one
			if i+10 > len(b) {
				return fr, false
			}
			fr.w = int(b[i+5]) | int(b[i+6])<<8
			fr.h = int(b[i+7]) | int(b[i+8])<<8
			fr.table = global
			if local, _ := table(b[i+9], i+10); local != nil {
				fr.table = local
			}
			return fr, true
		default: // the trailer, or not a GIF stream
			return fr, false
		}
	}
	return fr, false
}

// gifTransparentColour returns the first frame's transparent index and
// the colour its colour table gives it, which Go's GIF decoder replaces with
// transparent black before the image is returned. PIL keeps it:
// convert("RGB") of a GIF shows the table's colour where the frame is
// transparent, so the loader puts it back (withGIFTransparentColour).
// ok is false when the frame has no transparent index or the stream
// cannot be read that far (the decoder has judged the file already).
func gifTransparentColour(b []byte) (index int, c color.RGBA, ok bool) {
	fr, ok := gifFirstFrame(b)
	t := fr.transparent
	if !ok || t < 0 || 3*t+3 > len(fr.table) {
		return 0, c, false
	}
	return t, color.RGBA{fr.table[3*t], fr.table[3*t+1], fr.table[3*t+2], 255}, true
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
