package data

import (
	"bytes"
	"compress/lzw"
	"image/color"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyGIF is a 3x1 GIF89a with pixels 0, 1, 2 of a four-colour table
// (global, or local to the frame), index 1 transparent.
func tinyGIF(t testing.TB, local bool) []byte {
	var lz bytes.Buffer
	w := lzw.NewWriter(&lz, lzw.LSB, 2)
	_, err := w.Write([]byte{0, 1, 2})
	require.NoError(t, err)
	require.NoError(t, w.Close())
	table := []byte{10, 20, 30, 200, 100, 50, 7, 8, 9, 0, 0, 0}
	var b bytes.Buffer
	b.WriteString("GIF89a")
	b.Write([]byte{3, 0, 1, 0})
	if local {
		b.Write([]byte{0x00, 0, 0}) // no global table
	} else {
		b.Write([]byte{0x81, 0, 0}) // a global table of 4 colours
		b.Write(table)
	}
	b.Write([]byte{0x21, 0xFE, 2, 'h', 'i', 0})      // a comment extension first
	b.Write([]byte{0x21, 0xF9, 4, 0x01, 0, 0, 1, 0}) // graphic control: index 1 transparent
	b.Write([]byte{0x2C, 0, 0, 0, 0, 3, 0, 1, 0})    // image descriptor, 3x1
	if local {
		b.WriteByte(0x81)
		b.Write(table)
	} else {
		b.WriteByte(0)
	}
	b.WriteByte(2) // LZW minimum code size
	b.WriteByte(byte(lz.Len()))
	b.Write(lz.Bytes())
	b.Write([]byte{0, 0x3B})
	return b.Bytes()
}

// A transparent GIF pixel gets its colour-table colour, as PIL's
// convert("RGB") gives it, not the transparent black Go's decoder leaves.
func TestGIFTransparentIndexKeepsItsColour(t *testing.T) {
	for _, local := range []bool{false, true} {
		gif := tinyGIF(t, local)
		i, c, ok := gifTransparentColour(gif)
		require.True(t, ok)
		assert.Equal(t, 1, i)
		assert.Equal(t, color.RGBA{200, 100, 50, 255}, c)
		pix, w, h, err := decodeImage(gif, 3)
		require.NoError(t, err, "local table %v", local)
		assert.Equal(t, 3, w)
		assert.Equal(t, 1, h)
		assert.Equal(t, []uint8{10, 20, 30, 200, 100, 50, 7, 8, 9}, pix, "local table %v", local)
		gray, _, _, err := decodeImage(gif, 1)
		require.NoError(t, err)
		assert.Equal(t, grayFromRGB(200, 100, 50), gray[1])
	}
	// no transparency, or a stream cut short: nothing to restore
	plain := tinyGIF(t, false)
	plain[bytes.Index(plain, []byte{0x21, 0xF9})+3] = 0
	_, _, ok := gifTransparentColour(plain)
	assert.False(t, ok)
	for n := range 40 {
		_, _, ok := gifTransparentColour(tinyGIF(t, false)[:n])
		assert.False(t, ok, "first %d bytes", n)
	}
}
