package data

// The ImageFolder cache: one file holding every decoded, converted and
// resized image of a folder, so that later runs skip decoding. Layout, all
// integers little-endian:
//
//	header (64 bytes)
//	  0  magic "CNNCIMG\n"
//	  8  u32 layout version (cacheVersion)
//	 12  u32 pipeline version (pipelineVersion: what decoding, channel
//	     conversion and resizing produce)
//	 16  u32 H, u32 W, u32 C
//	 28  u32 entry count N
//	 32  u64 table length in bytes
//	 40  u32 CRC-32C of the table
//	 44  16 reserved zero bytes
//	 60  u32 CRC-32C of header bytes 0..59
//	payload: N slots of H*W*C bytes, slot i at 64 + i*H*W*C (HWC uint8;
//	         zeros for a bad file)
//	table, after the payload, one record per file in folder order:
//	  uvarint len + path relative to the root (slash-separated)
//	  varint size, varint mtime (Unix ns)
//	  32 bytes SHA-256 of the file's bytes
//	  uvarint len + reason the file is bad ("" when it decoded)
//	  u32 CRC-32C of the slot's pixels
//
// The table sits after the payload so that decoding workers can write
// slots at fixed offsets before the table's length is known. A file is
// taken from the cache when its path, size and mtime match its record, or,
// when they do not (or Rehash is set), when the SHA-256 of its bytes does.
// Any mismatch of magic, versions, shape, header or table checksum, file
// length (a truncated file) or a slot's checksum makes the file unusable:
// it is rebuilt, never used. Files are written to a temporary file in the
// same folder, fsynced and renamed over the old one, so a reader sees the
// old cache or the new one, never half of one.

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

const (
	cacheMagic      = "CNNCIMG\n"
	cacheVersion    = 1
	pipelineVersion = 1 // bump when decode.go or resize.go changes its output
	cacheHeaderSize = 64
	// maxCacheTable bounds the table a header may announce (~1 KiB/file
	// for 16M files), so a corrupt header cannot make us allocate wildly.
	maxCacheTable = 16 << 30
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// cacheEntry is one file's record in the cache table.
type cacheEntry struct {
	rel    string
	size   int64
	mtime  int64 // Unix nanoseconds
	sha256 [sha256.Size]byte
	bad    string // why the file could not be used; "" when it decoded
	crc    uint32 // CRC-32C of the slot's pixels
}

// cacheFile is an open, header- and table-checked cache file.
type cacheFile struct {
	path    string
	f       *os.File
	shape   Shape
	entries []cacheEntry
	byRel   map[string]int
}

func (c *cacheFile) slotOffset(i int) int64 {
	return cacheHeaderSize + int64(i)*int64(c.shape.Size())
}

// Close closes the cache file.
func (c *cacheFile) Close() error { return c.f.Close() }

// errNoCache means there is no cache file at the path.
var errNoCache = errors.New("no cache file")

// openCache opens and checks a cache file's header and table against the
// wanted shape. The payload is checked separately (verifySlots).
func openCache(path string, shape Shape) (*cacheFile, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoCache
	}
	if err != nil {
		return nil, err
	}
	c, err := readCache(f, path, shape)
	if err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

func readCache(f *os.File, path string, shape Shape) (*cacheFile, error) {
	var hdr [cacheHeaderSize]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return nil, fmt.Errorf("truncated header: %v", err)
	}
	if string(hdr[:8]) != cacheMagic {
		return nil, errors.New("not a cnnc image cache (bad magic)")
	}
	le := binary.LittleEndian
	if got := le.Uint32(hdr[60:]); got != crc32.Checksum(hdr[:60], crc32c) {
		return nil, errors.New("header checksum mismatch")
	}
	if v := le.Uint32(hdr[8:]); v != cacheVersion {
		return nil, fmt.Errorf("cache layout version %d, want %d", v, cacheVersion)
	}
	if v := le.Uint32(hdr[12:]); v != pipelineVersion {
		return nil, fmt.Errorf("made by image pipeline version %d, want %d", v, pipelineVersion)
	}
	got := Shape{H: int(le.Uint32(hdr[16:])), W: int(le.Uint32(hdr[20:])), C: int(le.Uint32(hdr[24:]))}
	if got != shape {
		return nil, fmt.Errorf("holds %v images, want %v", got, shape)
	}
	n := int64(le.Uint32(hdr[28:]))
	tableLen := int64(le.Uint64(hdr[32:]))
	if tableLen < 0 || tableLen > maxCacheTable {
		return nil, fmt.Errorf("implausible table length %d", tableLen)
	}
	tableOff := cacheHeaderSize + n*int64(shape.Size())
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if want := tableOff + tableLen; st.Size() != want {
		return nil, fmt.Errorf("file is %d bytes, header says %d (truncated or overwritten)", st.Size(), want)
	}
	table := make([]byte, tableLen)
	if _, err := f.ReadAt(table, tableOff); err != nil {
		return nil, fmt.Errorf("reading table: %v", err)
	}
	if crc32.Checksum(table, crc32c) != le.Uint32(hdr[40:]) {
		return nil, errors.New("table checksum mismatch")
	}
	entries, err := decodeCacheTable(table, int(n))
	if err != nil {
		return nil, err
	}
	c := &cacheFile{path: path, f: f, shape: shape, entries: entries, byRel: make(map[string]int, n)}
	for i, e := range entries {
		c.byRel[e.rel] = i
	}
	return c, nil
}

func encodeCacheTable(entries []cacheEntry) []byte {
	var b []byte
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(len(e.rel)))
		b = append(b, e.rel...)
		b = binary.AppendVarint(b, e.size)
		b = binary.AppendVarint(b, e.mtime)
		b = append(b, e.sha256[:]...)
		b = binary.AppendUvarint(b, uint64(len(e.bad)))
		b = append(b, e.bad...)
		b = binary.LittleEndian.AppendUint32(b, e.crc)
	}
	return b
}

func decodeCacheTable(b []byte, n int) ([]cacheEntry, error) {
	corrupt := errors.New("corrupt table")
	str := func() (string, bool) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return "", false
		}
		s := string(b[k : k+int(l)])
		b = b[k+int(l):]
		return s, true
	}
	num := func() (int64, bool) {
		v, k := binary.Varint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return v, true
	}
	entries := make([]cacheEntry, n)
	for i := range entries {
		e := &entries[i]
		var ok1, ok2, ok3, ok4 bool
		e.rel, ok1 = str()
		e.size, ok2 = num()
		e.mtime, ok3 = num()
		if !ok1 || !ok2 || !ok3 || len(b) < sha256.Size {
			return nil, corrupt
		}
		copy(e.sha256[:], b)
		b = b[sha256.Size:]
		e.bad, ok4 = str()
		if !ok4 || len(b) < 4 {
			return nil, corrupt
		}
		e.crc = binary.LittleEndian.Uint32(b)
		b = b[4:]
	}
	if len(b) != 0 {
		return nil, corrupt
	}
	return entries, nil
}

// verifySlots reads every decoded slot and checks its CRC: a cache is used
// only when all of it is intact.
func (c *cacheFile) verifySlots() error {
	buf := make([]byte, c.shape.Size())
	for i, e := range c.entries {
		if e.bad != "" {
			continue
		}
		if err := c.readSlot(i, buf); err != nil {
			return err
		}
	}
	return nil
}

// readSlot reads slot i into buf and checks it against its recorded CRC.
func (c *cacheFile) readSlot(i int, buf []byte) error {
	if _, err := c.f.ReadAt(buf, c.slotOffset(i)); err != nil {
		return fmt.Errorf("reading the image of %s: %v", c.entries[i].rel, err)
	}
	if crc32.Checksum(buf, crc32c) != c.entries[i].crc {
		return fmt.Errorf("checksum mismatch in the image of %s", c.entries[i].rel)
	}
	return nil
}

// createCacheTemp creates the temporary file a cache is built in; tests
// replace it to simulate a read-only data folder (root ignores permissions).
var createCacheTemp = func(dir string) (*os.File, error) {
	return os.CreateTemp(dir, ".cnnc-cache-*.tmp")
}

// cacheWriter builds a cache file in a temporary file.
type cacheWriter struct {
	f     *os.File
	path  string // final path
	shape Shape
}

func (w *cacheWriter) WriteAt(p []byte, off int64) (int, error) { return w.f.WriteAt(p, off) }
func (w *cacheWriter) ReadAt(p []byte, off int64) (int, error)  { return w.f.ReadAt(p, off) }

// abandon removes the temporary file.
func (w *cacheWriter) abandon() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// commit writes the table and header, fsyncs and renames the temporary
// file to its final path. The file stays open for reading either way: on a
// failure the temporary file is unlinked but the images remain readable.
func (w *cacheWriter) commit(entries []cacheEntry) (err error) {
	defer func() {
		if err != nil {
			os.Remove(w.f.Name())
		}
	}()
	// CreateTemp made it private; a data set's cache is as shareable as
	// the data set.
	w.f.Chmod(0o644)
	table := encodeCacheTable(entries)
	tableOff := cacheHeaderSize + int64(len(entries))*int64(w.shape.Size())
	if _, err := w.f.WriteAt(table, tableOff); err != nil {
		return err
	}
	// Slots of bad files were never written: make sure the file reaches
	// the table even when the last slots are such holes.
	if err := w.f.Truncate(tableOff + int64(len(table))); err != nil {
		return err
	}
	var hdr [cacheHeaderSize]byte
	le := binary.LittleEndian
	copy(hdr[:], cacheMagic)
	le.PutUint32(hdr[8:], cacheVersion)
	le.PutUint32(hdr[12:], pipelineVersion)
	le.PutUint32(hdr[16:], uint32(w.shape.H))
	le.PutUint32(hdr[20:], uint32(w.shape.W))
	le.PutUint32(hdr[24:], uint32(w.shape.C))
	le.PutUint32(hdr[28:], uint32(len(entries)))
	le.PutUint64(hdr[32:], uint64(len(table)))
	le.PutUint32(hdr[40:], crc32.Checksum(table, crc32c))
	le.PutUint32(hdr[60:], crc32.Checksum(hdr[:60], crc32c))
	if _, err := w.f.WriteAt(hdr[:], 0); err != nil {
		return err
	}
	if err := w.f.Sync(); err != nil {
		return err
	}
	if err := os.Rename(w.f.Name(), w.path); err != nil {
		return err
	}
	// Make the rename itself durable.
	if d, err := os.Open(filepath.Dir(w.path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// memorySlots holds the images when no cache file can be written.
type memorySlots []byte

func (m memorySlots) WriteAt(p []byte, off int64) (int, error) { return copy(m[off:], p), nil }
func (m memorySlots) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m)) {
		return 0, io.EOF
	}
	return copy(p, m[off:]), nil
}
