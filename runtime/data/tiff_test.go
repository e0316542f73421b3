package data

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/image/ccitt"
	"golang.org/x/image/tiff/lzw"
)

// grayTIFF is a little-endian 8-bit grey TIFF of w x h pixels whose blocks
// are the given byte ranges of data (placed after the header), with the
// given compression and RowsPerStrip (omitted when 0).
func grayTIFF(w, h uint32, compression uint16, rowsPerStrip uint32, data []byte, offsets, counts []uint32) []byte {
	const header = 8
	type entry struct {
		tag, typ uint16
		vals     []uint32
	}
	shift := func(vs []uint32) []uint32 {
		out := make([]uint32, len(vs))
		for i, v := range vs {
			out[i] = v + header
		}
		return out
	}
	entries := []entry{
		{tiffImageWidth, 4, []uint32{w}},
		{tiffImageLength, 4, []uint32{h}},
		{258, 3, []uint32{8}}, // BitsPerSample
		{tiffCompression, 3, []uint32{uint32(compression)}},
		{262, 3, []uint32{1}}, // BlackIsZero
		{tiffStripOffsets, 4, shift(offsets)},
		{277, 3, []uint32{1}}, // SamplesPerPixel
	}
	if rowsPerStrip != 0 {
		entries = append(entries, entry{tiffRowsPerStrip, 4, []uint32{rowsPerStrip}})
	}
	entries = append(entries, entry{tiffStripByteCounts, 4, counts})

	bo := binary.LittleEndian
	b := append([]byte("II*\x00\x00\x00\x00\x00"), data...)
	var arrays []byte // LONG arrays too long to sit in their entries
	ifd := uint32(len(b))
	arraysAt := ifd + 2 + 12*uint32(len(entries)) + 4
	dir := bo.AppendUint16(nil, uint16(len(entries)))
	for _, e := range entries {
		dir = bo.AppendUint16(dir, e.tag)
		dir = bo.AppendUint16(dir, e.typ)
		dir = bo.AppendUint32(dir, uint32(len(e.vals)))
		switch {
		case len(e.vals) > 1:
			dir = bo.AppendUint32(dir, arraysAt+uint32(len(arrays)))
			for _, v := range e.vals {
				arrays = bo.AppendUint32(arrays, v)
			}
		case e.typ == 3:
			dir = bo.AppendUint16(dir, uint16(e.vals[0]))
			dir = bo.AppendUint16(dir, 0)
		default:
			dir = bo.AppendUint32(dir, e.vals[0])
		}
	}
	dir = bo.AppendUint32(dir, 0) // no next directory
	bo.PutUint32(b[4:], ifd)
	return append(append(b, dir...), arrays...)
}

// The estimate of a crafted TIFF bounds what decoding it allocates: the
// decoder sizes its block buffers from the tags (RowsPerStrip as written,
// StripByteCounts, PackBits without a limit), not from the image, so a
// 9x6 image can cost megabytes. Each case's decode must allocate no more
// than inspectImage planned, and the plan must not be wildly above it
// (within 64x, so the estimate does not refuse ordinary files).
func TestTIFFEstimateBoundsCraftedBlocks(t *testing.T) {
	zeros := make([]byte, 1<<20)
	var deflated bytes.Buffer
	zw := zlib.NewWriter(&deflated)
	_, _ = zw.Write(zeros)
	require.NoError(t, zw.Close())
	var packed []byte // 2 bytes -> 128 zero bytes, 4096 times
	for range 4096 {
		packed = append(packed, 0x81, 0)
	}
	d := deflated.Bytes()
	n, np := uint32(len(d)), uint32(len(packed))
	shape := Shape{H: 4, W: 4, C: 1}
	for _, tc := range []struct {
		name string
		tiff []byte
	}{
		{"deflate, one strip of 2^32-1 rows", grayTIFF(9, 6, tiffDeflate, 1<<32-1, d, []uint32{0}, []uint32{n})},
		{"deflate, six strips sharing bytes", grayTIFF(9, 6, tiffDeflate, 1, d, []uint32{0, 0, 0, 0, 0, 0}, []uint32{n, n, n, n, n, n})},
		{"packbits, six strips sharing bytes", grayTIFF(9, 6, tiffPackBits, 1, packed, []uint32{0, 0, 0, 0, 0, 0}, []uint32{np, np, np, np, np, np})},
		{"uncompressed, six strips sharing bytes", grayTIFF(9, 6, tiffNone, 1, zeros[:4096], []uint32{0, 0, 0, 0, 0, 0}, []uint32{4096, 4096, 4096, 4096, 4096, 4096})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := inspectImage(tc.tiff, shape, maxDecodeBytes)
			require.NoError(t, err)
			var pix []uint8
			alloc := allocatedBy(func() { pix, err = plan.decodeResized(tc.tiff, shape) })
			require.NoError(t, err)
			assert.Len(t, pix, shape.Size())
			assert.LessOrEqual(t, alloc, uint64(plan.cost), "decoding allocated more than the estimate")
			assert.Less(t, uint64(plan.cost), 64*alloc+decodeSlack, "the estimate is far above what decoding allocates")
		})
	}
}

// A block whose bytes lie beyond the file is refused before decoding: the
// decoder would allocate its claimed size (up to 10 MiB a block) first.
// FuzzDecodeImage found a 917-byte TIFF allocating 2.6 MB this way
// (testdata/fuzz/FuzzDecodeImage/cbaca1c8c6ba415c).
func TestTIFFBlocksBeyondTheFileAreRefused(t *testing.T) {
	tiff := grayTIFF(9, 6, tiffNone, 0, make([]byte, 54), []uint32{0}, []uint32{9 << 20})
	var err error
	alloc := allocatedBy(func() { _, err = decodeResized(tiff, Shape{4, 4, 1}, maxDecodeBytes) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "corrupt image: its TIFF block 0 claims 9437184 bytes at 8, beyond the file's")
	assert.Less(t, alloc, uint64(1<<20), "%d bytes allocated", alloc)

	ok := grayTIFF(9, 6, tiffNone, 0, make([]byte, 54), []uint32{0}, []uint32{54})
	_, err = decodeResized(ok, Shape{4, 4, 1}, maxDecodeBytes)
	assert.NoError(t, err, "a block that ends at its data is fine")
}

// tiffBlockReaderBytes holds for the decompressors x/image/tiff makes for
// every block: measured here, so that an upgrade that grows them fails
// naming the constant. (PackBits' reader is unexported: measured as what
// unpackBits allocates before its output, a bufio.Reader and two buffers.)
func TestTIFFBlockReaderBytes(t *testing.T) {
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	_, _ = zw.Write([]byte("a block"))
	require.NoError(t, zw.Close())
	section := func() io.Reader { return io.NewSectionReader(bytes.NewReader(z.Bytes()), 0, int64(z.Len())) }
	readers := map[uint64]func(){
		tiffDeflate: func() {
			r, err := zlib.NewReader(section())
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, io.LimitReader(r, 0))
			_ = r.Close()
		},
		tiffLZW: func() {
			r := lzw.NewReader(section(), lzw.MSB, 8)
			_, _ = r.Read(nil)
			_ = r.Close()
		},
		tiffG4: func() {
			r := ccitt.NewReader(section(), ccitt.MSB, ccitt.Group4, 0, 1, &ccitt.Options{})
			_, _ = io.Copy(io.Discard, r)
		},
		tiffPackBits: func() {
			br := bufio.NewReader(section())
			_, _ = br.ReadByte()
			_, _ = make([]byte, 128), make([]byte, 0, 1024)
		},
	}
	for comp, read := range readers {
		read() // once-only initialisation (deflate's fixed tables) is not per block
		assert.LessOrEqual(t, allocatedBy(read), uint64(tiffBlockReaderBytes[comp]), "tiffBlockReaderBytes[%d]", comp)
	}
}
