package data

// What x/image/tiff allocates for a TIFF's pixel data, beyond the image.
//
// The decoder reads the image block by block (strips, or tiles), each
// through a buffer whose size the file's tags decide: an uncompressed block
// is read into a fresh slice of its StripByteCounts bytes (before the read
// can find that the file ends first); a compressed block is inflated into a
// buffer limited by the block's area at 8 bytes a pixel — where the block's
// height is RowsPerStrip as written, not clamped to the image — or, for
// PackBits, not limited at all. So a 9x6 image of a few hundred bytes can
// make it allocate megabytes. tiffBlockBytes counts all of it from the
// first directory, the way the decoder lays out its blocks (reader.go's
// Decode, x/image v0.30), and checkTIFFBlocks refuses a block whose bytes
// lie beyond the file, as checkTIFFOffsets does for tags.

import (
	"encoding/binary"
	"fmt"
	"math"
)

// TIFF tags and compression schemes the block layout depends on.
const (
	tiffImageWidth      = 256
	tiffImageLength     = 257
	tiffCompression     = 259
	tiffStripOffsets    = 273
	tiffRowsPerStrip    = 278
	tiffStripByteCounts = 279
	tiffTileWidth       = 322
	tiffTileLength      = 323
	tiffTileOffsets     = 324
	tiffTileByteCounts  = 325

	tiffNone        = 1
	tiffG3          = 3
	tiffG4          = 4
	tiffLZW         = 5
	tiffDeflate     = 8
	tiffPackBits    = 32773
	tiffDeflateOld  = 32946
	tiffMaxSafeRead = 10 << 20 // x/image/tiff's maxChunkSize
)

// Per-block allocations of the decompressors x/image/tiff makes afresh for
// every block (TestTIFFBlockReaderBytes measures them): zlib's inflater
// with its 32 KiB window, the LZW decoder's tables, the CCITT reader (plus
// two rows, counted separately), and PackBits' bufio.Reader and buffers.
var tiffBlockReaderBytes = map[uint64]int64{
	tiffDeflate:    64 << 10,
	tiffDeflateOld: 64 << 10,
	tiffLZW:        32 << 10,
	tiffG3:         4 << 10,
	tiffG4:         4 << 10,
	tiffPackBits:   8 << 10,
}

// Most bytes one byte of a block can decompress to: deflate's 258-byte
// match per 2 bits (1032); an LZW code of at least 9 bits per string of at
// most 4096 bytes (4096*8/9 < 3641); a PackBits run of 128 bytes per 2.
var tiffExpansion = map[uint64]int64{
	tiffDeflate:    pngMaxRatio,
	tiffDeflateOld: pngMaxRatio,
	tiffLZW:        3641,
	tiffPackBits:   64,
}

// tiffDirectory is what x/image/tiff reads of a TIFF's first directory to
// lay out its blocks.
type tiffDirectory struct {
	tags map[uint16][]uint64 // the unsigned integer tags, by tag
}

// first is a tag's first value, 0 when absent (the decoder's firstVal).
func (d tiffDirectory) first(tag uint16) uint64 {
	if v := d.tags[tag]; len(v) > 0 {
		return v[0]
	}
	return 0
}

// readTIFFDirectory reads the integer tags of b's first directory; false
// when b is not a TIFF or the directory is not all in the file (the
// decoder, or checkTIFFOffsets, refuses those).
func readTIFFDirectory(b []byte) (tiffDirectory, bool) {
	var bo binary.ByteOrder
	switch {
	case len(b) < 8:
		return tiffDirectory{}, false
	case string(b[:4]) == "II*\x00":
		bo = binary.LittleEndian
	case string(b[:4]) == "MM\x00*":
		bo = binary.BigEndian
	default:
		return tiffDirectory{}, false
	}
	n := uint64(len(b))
	ifd := uint64(bo.Uint32(b[4:]))
	if ifd+2 > n || ifd+2+12*uint64(bo.Uint16(b[ifd:])) > n {
		return tiffDirectory{}, false
	}
	d := tiffDirectory{tags: map[uint16][]uint64{}}
	for i := range uint64(bo.Uint16(b[ifd:])) {
		e := b[ifd+2+12*i:]
		typ, count := bo.Uint16(e[2:]), uint64(bo.Uint32(e[4:]))
		var size uint64
		switch typ {
		case 1: // BYTE
			size = 1
		case 3: // SHORT
			size = 2
		case 4: // LONG
			size = 4
		default:
			continue
		}
		data := e[8:12]
		if size*count > 4 {
			off := uint64(bo.Uint32(e[8:]))
			if off+size*count > n {
				return tiffDirectory{}, false
			}
			data = b[off : off+size*count]
		}
		vals := make([]uint64, count)
		for k := range vals {
			switch size {
			case 1:
				vals[k] = uint64(data[k])
			case 2:
				vals[k] = uint64(bo.Uint16(data[2*k:]))
			case 4:
				vals[k] = uint64(bo.Uint32(data[4*k:]))
			}
		}
		d.tags[bo.Uint16(e)] = vals
	}
	return d, true
}

// tiffBlock is one strip or tile as the decoder reads it.
type tiffBlock struct {
	offset, count uint64 // where its bytes are in the file
	w, h          int64  // the pixels it decodes
	limit         int64  // what the decoder lets it decompress to
}

// blocks lays the image's blocks out as the decoder does: tiles when
// TileWidth is set (padded to whole tiles), else strips of RowsPerStrip
// rows (the whole image when it is 0). Nothing when the decoder would
// refuse the layout before reading a block.
func (d tiffDirectory) blocks() []tiffBlock {
	width, height := d.first(tiffImageWidth), d.first(tiffImageLength)
	if width == 0 || height == 0 {
		return nil
	}
	bw, bh := width, height
	offsets, counts := d.tags[tiffStripOffsets], d.tags[tiffStripByteCounts]
	tiled := d.first(tiffTileWidth) != 0
	if tiled {
		bw, bh = d.first(tiffTileWidth), d.first(tiffTileLength)
		if bw < 8 || bh < 8 {
			return nil
		}
		offsets, counts = d.tags[tiffTileOffsets], d.tags[tiffTileByteCounts]
	} else if rps := d.first(tiffRowsPerStrip); rps != 0 {
		bh = rps
	}
	across, down := (width+bw-1)/bw, (height+bh-1)/bh
	if uint64(len(offsets)) < across*down || uint64(len(counts)) < across*down {
		return nil // "inconsistent header"
	}
	limit := saturatingProduct(int64(bw), int64(bh), 8)
	var out []tiffBlock
	for i := range across {
		w := bw
		if !tiled && i == across-1 && width%bw != 0 {
			w = width % bw
		}
		for j := range down {
			h := bh
			if !tiled && j == down-1 && height%bh != 0 {
				h = height % bh
			}
			k := j*across + i
			out = append(out, tiffBlock{offsets[k], counts[k], int64(w), int64(h), limit})
		}
	}
	return out
}

// checkTIFFBlocks refuses a TIFF one of whose blocks lies beyond the file:
// the decoder allocates an uncompressed block's claimed size before its
// read fails.
func checkTIFFBlocks(b []byte) error {
	d, ok := readTIFFDirectory(b)
	if !ok {
		return nil
	}
	n := uint64(len(b))
	for k, blk := range d.blocks() {
		if blk.offset > n || blk.count > n-blk.offset {
			return fmt.Errorf("corrupt image: its TIFF block %d claims %d bytes at %d, beyond the file's %d", k, blk.count, blk.offset, n)
		}
	}
	return nil
}

// tiffBlockBytes is what decoding b's blocks allocates, at most, beyond
// the image: every uncompressed block's slice, the one buffer deflate, LZW
// and CCITT blocks share (grown by doubling to the largest block: under 4x
// its size, plus size-class rounding), each PackBits block's own buffer
// (grown by append: under 5x its size once past 256 bytes, so 6x with
// rounding), and every block's decompressor.
func tiffBlockBytes(b []byte) int64 {
	d, ok := readTIFFDirectory(b)
	if !ok {
		return 0
	}
	comp := d.first(tiffCompression)
	var total, shared int64
	for _, blk := range d.blocks() {
		count := int64(min(blk.count, uint64(len(b))))
		total = saturatingSum(total, tiffBlockReaderBytes[comp])
		switch comp {
		case 0, tiffNone:
			if count < tiffMaxSafeRead {
				total = saturatingSum(total, count)
			} else { // read in 10 MiB chunks appended to a growing slice
				total = saturatingSum(total, tiffMaxSafeRead+6*count)
			}
		case tiffPackBits:
			total = saturatingSum(total, 6*(tiffExpansion[comp]*count+128))
		case tiffG3, tiffG4:
			// one byte a pixel, and the reader's two rows
			total = saturatingSum(total, 2*blk.w)
			shared = max(shared, min(blk.limit, saturatingProduct(blk.w, blk.h, 1)))
		case tiffLZW, tiffDeflate, tiffDeflateOld:
			shared = max(shared, min(blk.limit, saturatingProduct(tiffExpansion[comp], count+4, 1)))
		}
	}
	return saturatingSum(total, saturatingProduct(4, shared+bytesMinRead, 1)+(64<<10))
}

// bytesMinRead is bytes.MinRead: bytes.Buffer.ReadFrom grows by at least
// that much before every read.
const bytesMinRead = 512

// saturatingProduct is a*b*c for non-negative factors, or MaxInt64 when
// that overflows: a header's sizes are untrusted.
func saturatingProduct(a, b, c int64) int64 {
	p := float64(a) * float64(b) * float64(c)
	if p >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return a * b * c
}

// saturatingSum is a+b for non-negative terms, capped as saturatingProduct.
func saturatingSum(a, b int64) int64 {
	return min(a+b, math.MaxInt64/2) // both at most MaxInt64/2: no overflow
}
