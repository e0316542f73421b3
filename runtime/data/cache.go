package data

// The ImageFolder cache: one file holding every decoded, converted and
// resized image of a folder, so that later runs skip decoding. It lives in
// the user's cache folder (os.UserCacheDir()/cnnc/imagefolder) or
// ImageFolderOptions.CacheDir, never in the data folder, named after the
// folder's resolved absolute path (cacheName). Layout, all integers
// little-endian:
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
//	 44  i64 scan time: when the keys in the table were taken (Unix ns)
//	 52  8 reserved zero bytes
//	 60  u32 CRC-32C of header bytes 0..59
//	payload: N slots of H*W*C bytes, slot i at 64 + i*H*W*C (HWC uint8;
//	         zeros unless the file decoded)
//	table, after the payload:
//	  uvarint len + the folder's resolved absolute path
//	  then one record per file, in folder order:
//	  uvarint len + path relative to the folder (slash-separated)
//	  varint size, varint mtime, varint ctime (Unix ns), uvarint inode
//	  u8 state: 0 decoded, 1 bad (its content cannot be used), 2 not read
//	  32 bytes SHA-256 of the file's bytes (zero when not read)
//	  uvarint len + why the file is bad or was not read ("" when decoded)
//	  u32 CRC-32C of the slot's pixels (0 unless decoded)
//
// The table sits after the payload so that decoding workers can write
// slots at fixed offsets before the table's length is known. How records
// are matched to files (their key, else the SHA-256 of the bytes) is in
// imagefolder.go. Only what a file's fully read content decided is
// remembered — its pixels, or that it does not decode; a file that could
// not be read (permission denied, an I/O error) is "not read" and tried
// again next time. Any mismatch of magic, versions, shape, folder, header
// or table checksum, file length (a truncated file) or a slot's checksum
// makes the cache unusable: it is rebuilt, never used. Files are written
// to a temporary file in the same folder, fsynced and renamed over the old
// one, so a reader sees the old cache or the new one, never half of one.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cnnc/cnnc/runtime/regularfile"
)

const (
	cacheMagic      = "CNNCIMG\n"
	cacheVersion    = 2
	pipelineVersion = 1 // bump when decode.go or resize.go changes its output
	cacheHeaderSize = 64
	// minRecordBytes is the smallest table record: a one-byte path, four
	// one-byte numbers, the state, the hash, an empty reason, the CRC.
	minRecordBytes = 2 + 4 + 1 + sha256.Size + 1 + 4
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// entryState is what a record says about its file.
type entryState uint8

const (
	stateDecoded entryState = iota // the slot holds its pixels
	stateBad                       // its content cannot be used (reason)
	stateNotRead                   // it could not be read (reason); try again
)

// cacheEntry is one file's record in the cache table.
type cacheEntry struct {
	rel    string
	key    fileKey
	state  entryState
	sha256 [sha256.Size]byte
	reason string
	crc    uint32 // CRC-32C of the slot's pixels
}

// cacheFile is an open, header- and table-checked cache file.
type cacheFile struct {
	path     string
	f        *os.File
	shape    Shape
	root     string
	scanTime int64 // Unix ns
	entries  []cacheEntry
	byRel    map[string]int
}

func (c *cacheFile) slotOffset(i int) int64 {
	return cacheHeaderSize + int64(i)*int64(c.shape.Size())
}

// Close closes the cache file.
func (c *cacheFile) Close() error { return c.f.Close() }

// cacheName is the file name of a folder's cache for a shape: the
// folder's base name for the reader, and 64 bits of the SHA-256 of its
// resolved absolute path so that two folders never share a file.
func cacheName(root string, shape Shape) string {
	sum := sha256.Sum256([]byte(root))
	return fmt.Sprintf("%s-%s-%v.bin", filepath.Base(root), hex.EncodeToString(sum[:8]), shape)
}

// errNoCache means there is no cache file at the path.
var errNoCache = errors.New("no cache file")

// openCache opens and checks a cache file's header and table against the
// wanted shape and folder; an error (a *FileError) says why it cannot be
// used. The payload is checked separately (verifySlots). Only a regular
// file is opened, without blocking.
func openCache(path string, shape Shape, root string) (*cacheFile, error) {
	f, info, err := regularfile.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoCache
	}
	unusable := func(err error) error {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return &FileError{Path: path, Err: fmt.Errorf("cache unusable (%v)", err)}
	}
	if err != nil {
		return nil, unusable(err)
	}
	c, err := readCache(f, info.Size(), path, shape)
	if err == nil && c.root != root {
		err = fmt.Errorf("made for the folder %q", c.root)
	}
	if err != nil {
		f.Close()
		return nil, unusable(err)
	}
	c.f = f
	return c, nil
}

// readCache checks the header, then reads the table, whose length must
// match the file's size exactly: nothing a header says is allocated
// before it has been checked against the real file.
func readCache(f io.ReaderAt, size int64, path string, shape Shape) (*cacheFile, error) {
	var hdr [cacheHeaderSize]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
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
	tableLen := le.Uint64(hdr[32:])
	// shape.Size() < 2^30 (validated), n < 2^32: the payload fits an int64.
	tableOff := cacheHeaderSize + n*int64(shape.Size())
	if tableLen > uint64(size) || size-int64(tableLen) != tableOff {
		return nil, fmt.Errorf("file is %d bytes, header says %d entries of %d bytes and a %d-byte table (truncated or overwritten)", size, n, shape.Size(), tableLen)
	}
	if n*minRecordBytes > int64(tableLen) {
		return nil, fmt.Errorf("a %d-byte table cannot hold %d entries", tableLen, n)
	}
	table := make([]byte, tableLen)
	if _, err := f.ReadAt(table, tableOff); err != nil {
		return nil, fmt.Errorf("reading table: %v", err)
	}
	if crc32.Checksum(table, crc32c) != le.Uint32(hdr[40:]) {
		return nil, errors.New("table checksum mismatch")
	}
	root, entries, err := decodeCacheTable(table, int(n))
	if err != nil {
		return nil, err
	}
	c := &cacheFile{path: path, shape: shape, root: root, scanTime: int64(le.Uint64(hdr[44:])), entries: entries, byRel: make(map[string]int, n)}
	for i, e := range entries {
		if _, dup := c.byRel[e.rel]; dup {
			return nil, fmt.Errorf("corrupt table: %q listed twice", e.rel)
		}
		c.byRel[e.rel] = i
	}
	return c, nil
}

func encodeCacheTable(root string, entries []cacheEntry) []byte {
	b := binary.AppendUvarint(nil, uint64(len(root)))
	b = append(b, root...)
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(len(e.rel)))
		b = append(b, e.rel...)
		b = binary.AppendVarint(b, e.key.size)
		b = binary.AppendVarint(b, e.key.mtime)
		b = binary.AppendVarint(b, e.key.ctime)
		b = binary.AppendUvarint(b, e.key.ino)
		b = append(b, byte(e.state))
		b = append(b, e.sha256[:]...)
		b = binary.AppendUvarint(b, uint64(len(e.reason)))
		b = append(b, e.reason...)
		b = binary.LittleEndian.AppendUint32(b, e.crc)
	}
	return b
}

// tableReader reads a table's fields; the first malformed one sets bad.
type tableReader struct {
	b   []byte
	bad bool
}

func (r *tableReader) str() string {
	l, k := binary.Uvarint(r.b)
	if k <= 0 || l > uint64(len(r.b)-k) {
		r.bad = true
		return ""
	}
	s := string(r.b[k : k+int(l)])
	r.b = r.b[k+int(l):]
	return s
}

func (r *tableReader) varint() int64 {
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *tableReader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *tableReader) bytes(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return make([]byte, n)
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func decodeCacheTable(b []byte, n int) (string, []cacheEntry, error) {
	corrupt := errors.New("corrupt table")
	r := &tableReader{b: b}
	root := r.str()
	entries := make([]cacheEntry, n)
	for i := range entries {
		e := &entries[i]
		e.rel = r.str()
		e.key = fileKey{size: r.varint(), mtime: r.varint(), ctime: r.varint(), ino: r.uvarint()}
		e.state = entryState(r.bytes(1)[0])
		copy(e.sha256[:], r.bytes(sha256.Size))
		e.reason = r.str()
		e.crc = binary.LittleEndian.Uint32(r.bytes(4))
		if r.bad || e.rel == "" || e.state > stateNotRead {
			return "", nil, corrupt
		}
	}
	if len(r.b) != 0 {
		return "", nil, corrupt
	}
	return root, entries, nil
}

// verifySlots reads every decoded slot and checks its CRC: a cache is used
// only when all of it is intact.
func (c *cacheFile) verifySlots() error {
	buf := make([]byte, c.shape.Size())
	for i, e := range c.entries {
		if e.state != stateDecoded {
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
// replace it to simulate a read-only cache folder (root ignores
// permissions).
var createCacheTemp = func(dir string) (*os.File, error) {
	return os.CreateTemp(dir, ".cnnc-cache-*.tmp")
}

// cacheWriter builds a cache file in a temporary file.
type cacheWriter struct {
	f        *os.File
	path     string // final path
	shape    Shape
	root     string
	scanTime int64
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
	table := encodeCacheTable(w.root, entries)
	tableOff := cacheHeaderSize + int64(len(entries))*int64(w.shape.Size())
	if _, err := w.f.WriteAt(table, tableOff); err != nil {
		return err
	}
	// Slots of bad files were never written: make sure the file reaches
	// the table even when the last slots are such holes.
	if err := w.f.Truncate(tableOff + int64(len(table))); err != nil {
		return err
	}
	hdr := cacheHeader(w.shape, len(entries), table, w.scanTime)
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

// cacheHeader is the header of a cache of n entries with this table.
func cacheHeader(shape Shape, n int, table []byte, scanTime int64) [cacheHeaderSize]byte {
	var hdr [cacheHeaderSize]byte
	le := binary.LittleEndian
	copy(hdr[:], cacheMagic)
	le.PutUint32(hdr[8:], cacheVersion)
	le.PutUint32(hdr[12:], pipelineVersion)
	le.PutUint32(hdr[16:], uint32(shape.H))
	le.PutUint32(hdr[20:], uint32(shape.W))
	le.PutUint32(hdr[24:], uint32(shape.C))
	le.PutUint32(hdr[28:], uint32(n))
	le.PutUint64(hdr[32:], uint64(len(table)))
	le.PutUint32(hdr[40:], crc32.Checksum(table, crc32c))
	le.PutUint64(hdr[44:], uint64(scanTime))
	le.PutUint32(hdr[60:], crc32.Checksum(hdr[:60], crc32c))
	return hdr
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
