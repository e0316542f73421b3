package data

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/png"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pngClaiming is a well-formed PNG whose header claims w x h pixels of the
// given bit depth and colour type but whose data is a few bytes of zeros.
func pngClaiming(w, h uint32, depth, colourType byte) []byte {
	chunk := func(b *bytes.Buffer, kind string, data []byte) {
		binary.Write(b, binary.BigEndian, uint32(len(data)))
		crc := crc32.NewIEEE()
		crc.Write([]byte(kind))
		crc.Write(data)
		b.WriteString(kind)
		b.Write(data)
		binary.Write(b, binary.BigEndian, crc.Sum32())
	}
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	chunk(&b, "IHDR", append(ihdr, depth, colourType, 0, 0, 0))
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(make([]byte, 64))
	zw.Close()
	chunk(&b, "IDAT", z.Bytes())
	chunk(&b, "IEND", nil)
	return b.Bytes()
}

// allocatedBy is how many bytes fn allocates.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A header is checked before anything is decoded: a small file claiming a
// huge image is an error, and nothing near the claimed size is allocated.
func TestImageHeadersAreCheckedBeforeDecoding(t *testing.T) {
	shape := Shape{32, 32, 3}
	for _, tc := range []struct {
		name    string
		encoded []byte
		want    string
	}{
		{"100000x100000", pngClaiming(100000, 100000, 8, 6),
			"PNG image of 100000x100000 pixels is larger than 178956970 pixels (a decompression bomb?)"},
		// 169 M pixels of 16-bit RGBA is 1.35 GB, which Go's decoder
		// allocates on reading the first IDAT chunk.
		{"13000x13000 RGBA64", pngClaiming(13000, 13000, 16, 6),
			"corrupt image: its PNG header claims 13000x13000 pixels, more than its 72 bytes can encode"},
		{"GIF frame", gifClaiming(65535, 2000),
			"corrupt image: its GIF header claims 65535x2000 pixels, more than its 35 bytes can encode"},
	} {
		var err error
		alloc := allocatedBy(func() { _, err = decodeResized(tc.encoded, shape, maxDecodeBytes) })
		assert.EqualError(t, err, tc.want, tc.name)
		assert.Less(t, alloc, uint64(1<<20), "%s: %d bytes allocated", tc.name, alloc)
	}
}

// gifClaiming is a GIF whose first frame claims w x h pixels with two
// bytes of LZW data.
func gifClaiming(w, h uint16) []byte {
	var b bytes.Buffer
	b.WriteString("GIF89a")
	binary.Write(&b, binary.LittleEndian, [2]uint16{w, h})
	b.Write([]byte{0x80, 0, 0, 0, 0, 0, 255, 255, 255}) // a 2-colour global table
	b.WriteByte(0x2C)
	binary.Write(&b, binary.LittleEndian, [4]uint16{0, 0, w, h})
	b.Write([]byte{0, 2, 2, 0x44, 0x01, 0, 0x3B})
	return b.Bytes()
}

// A legitimate file whose decoding (here: resizing a 1x10,000,000 image
// to 128x128, whose horizontal pass alone is 3.8 GB) would take more than
// one image may use is refused with the estimate, before decoding.
func TestImagesTooCostlyToDecodeAreRefused(t *testing.T) {
	tall := image.NewGray(image.Rect(0, 0, 1, 10_000_000))
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, tall))
	var err error
	alloc := allocatedBy(func() { _, err = decodeResized(b.Bytes(), Shape{128, 128, 3}, maxDecodeBytes) })
	assert.ErrorContains(t, err, "decoding this 1x10000000 PNG image would take about 3")
	assert.ErrorContains(t, err, "MiB of memory, more than the 2048 MiB one image may use")
	assert.Less(t, alloc, uint64(1<<20))

	// At its own size it is fine.
	pix, w, h, err := decodeImage(b.Bytes(), 1)
	require.NoError(t, err)
	assert.Equal(t, 1, w)
	assert.Equal(t, 10_000_000, h)
	assert.Len(t, pix, 10_000_000)
}

// The estimate bounds what decoding, converting and resizing allocate, for
// every format and layout of the fixture images and Pillow's references.
func TestDecodeCostBoundsAllocation(t *testing.T) {
	root, files := makeFolder(t)
	paths := []string{}
	for _, f := range files {
		paths = append(paths, root+"/"+f.rel)
	}
	for _, f := range []string{"cmyk.jpg", "lossless.webp", "lossy.webp", "rgb16.png", "ycc.jpg", "ycc422.jpg"} {
		paths = append(paths, "testdata/pil/"+f)
	}
	for _, p := range paths {
		encoded := readFile(t, p)
		for _, shape := range []Shape{{7, 300, 3}, {64, 64, 1}} {
			plan, err := inspectImage(encoded, shape, maxDecodeBytes)
			require.NoError(t, err, p)
			alloc := allocatedBy(func() { _, err = plan.decodeResized(encoded, shape) })
			require.NoError(t, err, p)
			assert.LessOrEqual(t, alloc, uint64(plan.cost), "%s to %v", p, shape)
		}
	}
}

// The gate never lets more than its capacity be taken at once, serves
// requests in order, and lets a request larger than the capacity run
// alone.
func TestMemoryGate(t *testing.T) {
	g := newMemoryGate(100)
	var used, peak atomic.Int64
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := g.acquire(int64(10 + (i*37)%150))
			u := used.Add(n)
			for p := peak.Load(); u > p && !peak.CompareAndSwap(p, u); p = peak.Load() {
			}
			time.Sleep(time.Millisecond)
			used.Add(-n)
			g.release(n)
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int64(100))
	assert.Equal(t, int64(0), g.used)
}

// A TIFF whose header points its first IFD 4 GB into an 8-byte file: Go's
// TIFF decoder, given a reader without ReadAt (image.DecodeConfig wraps
// plain readers in a bufio.Reader), grows a buffer to that offset before
// reading — 4 GB. And one whose tag claims 4 MiB of values in a 26-byte
// file: the decoder allocates them (and 8 bytes per value more) before
// reading. Both found by FuzzDecodeImage.
func TestTIFFOffsetsDoNotAllocate(t *testing.T) {
	// One directory entry: StripOffsets, 2^20 LONGs (4 MiB) at offset 8.
	tag := []byte("II*\x00\x08\x00\x00\x00\x01\x00\x11\x01\x04\x00\x00\x00\x10\x00\x08\x00\x00\x00\x00\x00\x00\x00")
	for _, tiff := range [][]byte{
		[]byte("II*\x00\xf0\xff\xff\xff"),
		[]byte("MM\x00*\x7f\xff\xff\xf0"),
		tag,
	} {
		var err error
		alloc := allocatedBy(func() { _, err = decodeResized(tiff, Shape{4, 4, 1}, maxDecodeBytes) })
		assert.Error(t, err)
		assert.Less(t, alloc, uint64(1<<20), "%d bytes allocated", alloc)
	}
}

// A 36-byte lossless WebP (53x41) whose meta image names Huffman group
// 40000-odd: x/image/vp8l allocates the whole group table (~117 MB)
// before reading a tree. The estimate includes that table. Found by
// FuzzDecodeImage.
func TestWebPGroupTableIsInTheEstimate(t *testing.T) {
	webp := []byte("RIFFt\x06\x00\x00WEBPVP8Lg\x06\x00\x00/4\x00\n\x00t\xdbʻַ\xfe\x15o\xf3\x10")
	shape := Shape{8, 8, 3}
	plan, err := inspectImage(webp, shape, maxDecodeBytes)
	require.NoError(t, err)
	alloc := allocatedBy(func() { _, err = plan.decodeResized(webp, shape) })
	assert.Greater(t, alloc, uint64(100<<20), "the decoder still allocates the table")
	assert.LessOrEqual(t, alloc, uint64(plan.cost))
}
