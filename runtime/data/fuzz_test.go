package data

// Fuzz targets for every reader of untrusted bytes in this package: IDX
// files, the image decoders' entry point (file bytes -> resized pixels)
// and the image cache file. Each checks properties of what it reads, not
// only that nothing panics: errors name the file, what is returned agrees
// with the header, reading again gives the same, and allocation stays
// within what the input can legitimately need.

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/image/bmp"
	"golang.org/x/image/tiff"
)

// FuzzIDX reads bytes as an IDX image or label file, plain or gzipped
// (kind&1: labels; kind&6: 0 plain, 2 gzipped by the test, 4 written as
// they are to a .gz file).
func FuzzIDX(f *testing.F) {
	m := testMNIST(f)
	var images, labels bytes.Buffer
	binary.Write(&images, binary.BigEndian, []uint32{idxImagesMagic, 3, 28, 28})
	images.Write(m.Images.Pixels[:3*28*28])
	binary.Write(&labels, binary.BigEndian, []uint32{idxLabelsMagic, 3})
	labels.Write(m.Labels[:3])
	for kind := range uint8(6) {
		seed := images.Bytes()
		if kind&1 != 0 {
			seed = labels.Bytes()
		}
		if kind&6 == 4 {
			seed = gzipped(seed)
		}
		f.Add(seed, kind)
	}
	f.Add(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, idxImagesMagic), 1<<28), uint8(0))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		labelFile, file := kind&1 != 0, data
		path := filepath.Join(dir, "train-images-idx3-ubyte")
		if labelFile {
			path = filepath.Join(dir, "train-labels-idx1-ubyte")
		}
		plain := data // the IDX bytes, when the test knows them
		switch kind & 6 {
		case 2:
			file, path = gzipped(data), path+".gz"
		case 4, 6:
			plain, path = nil, path+".gz"
		}
		if err := os.WriteFile(path, file, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		var got []byte
		var n, h, w int
		var err error
		alloc := allocatedBy(func() {
			if labelFile {
				got, err = ReadIDXLabels(path)
				n, h, w = len(got), 1, 1
			} else {
				var im *Images
				if im, err = ReadIDXImages(path); err == nil {
					got, n, h, w = im.Pixels, im.N, im.H, im.W
				}
			}
		})
		// A gzipped file may legitimately expand 1032 times.
		if bound := uint64(1032*len(file) + 1<<20); alloc > bound {
			t.Fatalf("reading a %d-byte file allocated %d bytes", len(file), alloc)
		}
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		hdr := 16
		if labelFile {
			hdr = 8
		}
		if n <= 0 && !labelFile || h <= 0 || w <= 0 || len(got) != n*h*w {
			t.Fatalf("%d bytes for %dx%dx%d", len(got), n, h, w)
		}
		if plain != nil && !bytes.Equal(plain, append(plain[:hdr:hdr], got...)) {
			t.Fatalf("data read is not the file's %d bytes after its header", len(plain)-hdr)
		}
	})
}

func gzipped(b []byte) []byte {
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	w.Write(b)
	w.Close()
	return z.Bytes()
}

// vp8lTreeAllowance is what x/image/vp8l may allocate for Huffman trees
// per byte of a crafted lossless WebP, beyond the estimate: a 2048-symbol
// tree (32 KiB of nodes, 16 KiB of code lengths and codes while it is
// built) costs about 18 bits.
const vp8lTreeAllowance = (48 << 10) * 8 / 18

// fuzzDecodeBudget keeps the fuzzer's memory small: the estimate is what
// is checked, at any budget.
const fuzzDecodeBudget = 16 << 20

// FuzzDecodeImage turns bytes into resized pixels as a folder's image
// file is turned into a sample. Reading the header allocates little; the
// estimate made from it bounds what decoding allocates; the pixels are the
// shape's size; decoding again gives the same; decoding at the image's
// own size and resizing gives the same.
func FuzzDecodeImage(f *testing.F) {
	for _, name := range []string{"ycc.jpg", "ycc422.jpg", "cmyk.jpg", "lossy.webp", "lossless.webp", "rgb16.png", "l.png", "resize_rgb_7x5.png"} {
		b, err := os.ReadFile("testdata/pil/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(5), uint8(7), false)
	}
	d, _ := digit(f, 3)
	small := scaled(d, 9, 6)
	for _, enc := range []func(*bytes.Buffer) error{
		func(b *bytes.Buffer) error { return bmp.Encode(b, paletted(small)) },
		func(b *bytes.Buffer) error {
			return tiff.Encode(b, tinted(small, 1, 2, 3), &tiff.Options{Compression: tiff.Deflate})
		},
		func(b *bytes.Buffer) error { return tiff.Encode(b, small, nil) },
	} {
		var b bytes.Buffer
		if err := enc(&b); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes(), uint8(3), uint8(4), true)
	}
	f.Add(tinyGIF(f, false), uint8(1), uint8(2), false)
	f.Add(pngClaiming(13000, 13000, 16, 6), uint8(8), uint8(8), false)
	f.Add(gifClaiming(65535, 2000), uint8(8), uint8(8), true)
	f.Fuzz(func(t *testing.T, encoded []byte, h, w uint8, gray bool) {
		shape := Shape{H: 1 + int(h%48), W: 1 + int(w%48), C: 3}
		if gray {
			shape.C = 1
		}
		var plan imagePlan
		var err error
		// Reading a header allocates little, whatever it claims.
		if alloc := allocatedBy(func() { plan, err = inspectImage(encoded, shape, fuzzDecodeBudget) }); alloc > uint64(2*len(encoded)+decodeSlack) {
			t.Fatalf("reading the header of %d bytes allocated %d bytes", len(encoded), alloc)
		}
		if err != nil {
			if _, err2 := decodeResized(encoded, shape, fuzzDecodeBudget); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("inspecting says %v, decoding %v", err, err2)
			}
			return
		}
		var pix []uint8
		alloc := allocatedBy(func() { pix, err = plan.decodeResized(encoded, shape) })
		bound := uint64(plan.cost)
		if plan.format == "webp" {
			bound += vp8lTreeAllowance * uint64(len(encoded)) // see vp8lGroupTableBytes
		}
		if alloc > bound {
			t.Fatalf("%s %dx%d: decoding allocated %d bytes, the estimate was %d", plan.format, plan.w, plan.h, alloc, plan.cost)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		if len(pix) != shape.Size() {
			t.Fatalf("%d bytes for %v", len(pix), shape)
		}
		again, err := decodeResized(encoded, shape, fuzzDecodeBudget)
		if err != nil || !bytes.Equal(again, pix) {
			t.Fatalf("decoding again differs (%v)", err)
		}
		native, nw, nh, err := plan.decode(encoded, shape.C)
		if err != nil || !bytes.Equal(resizeBilinear(native, nw, nh, shape.C, shape.W, shape.H), pix) {
			t.Fatalf("decode then resize differs (%v)", err)
		}
	})
}

// fuzzCacheRoot and fuzzCacheShape describe the folder of the seed caches.
const fuzzCacheRoot = "/data/fuzz"

var fuzzCacheShapes = []Shape{{2, 3, 1}, {1, 1, 3}}

// fuzzCache is a cache file of entries in every state.
func fuzzCache(shape Shape) []byte {
	entries := []cacheEntry{
		{rel: "a/x.png", key: fileKey{size: 100, mtime: 5, ctime: 6, ino: 7}, state: stateDecoded},
		{rel: "a/bad.jpg", key: fileKey{size: 3, mtime: -1, ctime: 1 << 40, ino: 1 << 63}, state: stateBad, reason: "not a JPEG, PNG, GIF, BMP, WebP or TIFF image"},
		{rel: "b/locked.gif", state: stateNotRead, reason: "permission denied"},
		{rel: "b/y.bmp", key: fileKey{size: 1}, state: stateDecoded},
	}
	size := shape.Size()
	payload := make([]byte, len(entries)*size)
	for i := range entries {
		entries[i].sha256 = sha256.Sum256([]byte(entries[i].rel))
		if entries[i].state == stateDecoded {
			slot := payload[i*size : (i+1)*size]
			for k := range slot {
				slot[k] = byte(i*31 + k)
			}
			entries[i].crc = crc32.Checksum(slot, crc32c)
		}
	}
	table := encodeCacheTable(fuzzCacheRoot, entries)
	hdr := cacheHeader(shape, len(entries), table, 1e18)
	return append(append(hdr[:], payload...), table...)
}

// FuzzImageCache opens bytes as an image cache file. fixCRC rewrites the
// table's and the header's checksums after the mutation, so that the
// table parser sees arbitrary bytes too. Either the cache is refused with
// an error naming the file, or it agrees with its header: the file's
// length is the header, the slots and the table; records are unique and
// re-encode to a table that decodes to the same records; a slot is served
// only when its checksum holds.
func FuzzImageCache(f *testing.F) {
	for i, shape := range fuzzCacheShapes {
		f.Add(fuzzCache(shape), uint8(i), false)
		f.Add(fuzzCache(shape), uint8(i), true)
	}
	dir := f.TempDir()
	path := filepath.Join(dir, cacheName(fuzzCacheRoot, fuzzCacheShapes[0]))
	f.Fuzz(func(t *testing.T, data []byte, which uint8, fixCRC bool) {
		shape := fuzzCacheShapes[int(which)%len(fuzzCacheShapes)]
		if fixCRC && len(data) >= cacheHeaderSize {
			data = append([]byte(nil), data...)
			le := binary.LittleEndian
			tableLen := le.Uint64(data[32:])
			if tableLen <= uint64(len(data)-cacheHeaderSize) {
				le.PutUint32(data[40:], crc32.Checksum(data[uint64(len(data))-tableLen:], crc32c))
			}
			le.PutUint32(data[60:], crc32.Checksum(data[:60], crc32c))
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var c *cacheFile
		var err error
		alloc := allocatedBy(func() { c, err = openCache(path, shape, fuzzCacheRoot) })
		if bound := uint64(16*len(data) + 1<<20); alloc > bound {
			t.Fatalf("opening a %d-byte cache allocated %d bytes", len(data), alloc)
		}
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) || fe.Path != path || !strings.HasPrefix(err.Error(), path+": cache unusable (") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		defer c.Close()
		table := encodeCacheTable(c.root, c.entries)
		if want := cacheHeaderSize + len(c.entries)*shape.Size() + int(binary.LittleEndian.Uint64(data[32:])); len(data) != want {
			t.Fatalf("a %d-byte file accepted for %d entries", len(data), len(c.entries))
		}
		root, entries, err := decodeCacheTable(table, len(c.entries))
		if err != nil || root != c.root || len(entries) != len(c.entries) {
			t.Fatalf("records do not survive re-encoding: %v", err)
		}
		for i, e := range entries {
			if e != c.entries[i] || c.byRel[e.rel] != i {
				t.Fatalf("record %d differs after re-encoding, or is not found by its path", i)
			}
			if e.state > stateNotRead || e.rel == "" {
				t.Fatalf("record %d accepted with state %d, path %q", i, e.state, e.rel)
			}
		}
		buf := make([]byte, shape.Size())
		for i, e := range c.entries {
			if e.state != stateDecoded {
				continue
			}
			if err := c.readSlot(i, buf); err == nil && crc32.Checksum(buf, crc32c) != e.crc {
				t.Fatalf("slot %d served with a wrong checksum", i)
			} else if err != nil && !strings.Contains(err.Error(), e.rel) {
				t.Fatalf("slot error does not name the file: %v", err)
			}
		}
		if err := c.verifySlots(); err != nil && !strings.Contains(err.Error(), "the image of ") {
			t.Fatalf("verifySlots: %v", err)
		}
	})
}

// The fuzz targets' synthetic seed caches are valid caches: the fuzzer
// starts from files that open.
func TestFuzzCacheSeedsOpen(t *testing.T) {
	for _, shape := range fuzzCacheShapes {
		path := filepath.Join(t.TempDir(), "c.bin")
		if err := os.WriteFile(path, fuzzCache(shape), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := openCache(path, shape, fuzzCacheRoot)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.verifySlots(); err != nil {
			t.Fatal(err)
		}
		if len(c.entries) != 4 || c.entries[1].state != stateBad || c.entries[2].reason != "permission denied" {
			t.Fatalf("entries: %+v", c.entries)
		}
		c.Close()
		_, err = openCache(path, shape, "/elsewhere")
		if err == nil || !strings.Contains(err.Error(), `made for the folder "/data/fuzz"`) {
			t.Fatalf("a cache of another folder: %v", err)
		}
	}
}
