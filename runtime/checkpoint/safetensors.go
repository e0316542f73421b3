// Package checkpoint reads and writes training checkpoints in the
// safetensors format, so PyTorch (safetensors.torch.load_file) reads them
// as they are.
//
// In:  named tensors (parameters under PyTorch's state_dict names and
// layouts, optimizer state under "optimizer.<param>.<state>") and string
// metadata (step, epoch, seed, shuffle state).
// Out: a file written atomically — a temporary file in the same directory,
// fsynced, renamed over the old one, the directory fsynced — so a crash or
// kill -9 at any moment leaves either the old checkpoint or the new one,
// never a torn file.
//
// Reading validates everything (a regular file, header size against the
// file's, JSON, dtypes, shapes against byte ranges, ranges tiling the data
// exactly as the safetensors library requires) and every error names the
// file and the tensor. Nothing read is trusted for a size: a file's bytes
// are read only up to its real size.
package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/cnnc/cnnc/runtime/regularfile"
)

// DType is a safetensors element type.
type DType string

const (
	F32 DType = "F32"
	I32 DType = "I32"
	I64 DType = "I64"
	U8  DType = "U8"
)

// Size is the byte size of one element.
func (d DType) Size() (int64, bool) {
	switch d {
	case F32, I32:
		return 4, true
	case I64:
		return 8, true
	case U8:
		return 1, true
	}
	return 0, false
}

// Tensor is one named tensor; Data is little-endian.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// Elems is the element count of the shape.
func (t Tensor) Elems() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// F32Tensor makes an F32 tensor from values.
func F32Tensor(name string, shape []int64, vals []float32) Tensor {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return Tensor{Name: name, DType: F32, Shape: shape, Data: b}
}

// Float32s decodes an F32 tensor's data.
func (t Tensor) Float32s() []float32 {
	out := make([]float32, len(t.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out
}

// File is a read checkpoint.
type File struct {
	Path     string
	Tensors  []Tensor // in file order
	Metadata map[string]string
	byName   map[string]int
}

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (Tensor, bool) {
	i, ok := f.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return f.Tensors[i], true
}

// Expect returns the named tensor after checking its dtype and shape, with
// an error that names the tensor and what differs.
func (f *File) Expect(name string, dtype DType, shape []int64) (Tensor, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return t, fmt.Errorf("%s: no tensor %q (is this a checkpoint of another model?)", f.Path, name)
	}
	if t.DType != dtype {
		return t, fmt.Errorf("%s: tensor %q is %s, want %s", f.Path, name, t.DType, dtype)
	}
	if !equalShape(t.Shape, shape) {
		return t, fmt.Errorf("%s: tensor %q has shape %v, the model needs %v", f.Path, name, t.Shape, shape)
	}
	return t, nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// maxHeader bounds the JSON header (safetensors itself allows 100 MB).
const maxHeader = 100 << 20

// Encode writes tensors and metadata in safetensors layout to w.
func Encode(w io.Writer, tensors []Tensor, meta map[string]string) error {
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	var off int64
	seen := map[string]bool{}
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" || seen[t.Name] {
			return fmt.Errorf("checkpoint: bad or duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		size, ok := t.DType.Size()
		if !ok {
			return fmt.Errorf("checkpoint: tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if int64(len(t.Data)) != size*t.Elems() {
			return fmt.Errorf("checkpoint: tensor %q: %d bytes for shape %v of %s", t.Name, len(t.Data), t.Shape, t.DType)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		header[t.Name] = headerEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(header)
	if err != nil {
		return err
	}
	// pad the header with spaces to 8 bytes so the data is aligned
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// Write saves a checkpoint atomically: path holds the old checkpoint or the
// complete new one at every moment, even if the process is killed.
//
// An existing path must be a regular file (a link to one is replaced by
// the new file): a folder, a FIFO or a device is refused by name, never
// replaced.
func Write(path string, tensors []Tensor, meta map[string]string) error {
	if st, err := os.Stat(path); err == nil {
		if err := regularfile.Check(path, st); err != nil {
			return fmt.Errorf("checkpoint %s: %v", path, errors.Unwrap(err))
		}
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint %s: cannot create a temporary file in its folder: %v", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := Encode(tmp, tensors, meta); err != nil {
		return fmt.Errorf("checkpoint %s: %v", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("checkpoint %s: %v", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint %s: %v", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint %s: %v", path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		d.Sync() // make the rename durable; not all filesystems support it
		d.Close()
	}
	return nil
}

// Read loads and validates a checkpoint. Only a regular file is read (a
// FIFO or a device such as /dev/zero is refused by name, without
// blocking), and never more of it than its size: the header's length is
// checked against the file's size before anything else is read.
func Read(path string) (*File, error) {
	f, info, err := regularfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return nil, fmt.Errorf("%s: not a safetensors file: shorter than its 8-byte header size", path)
	}
	if err := checkHeaderLength(binary.LittleEndian.Uint64(n[:]), info.Size()); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	data := make([]byte, 8, info.Size())
	copy(data, n[:])
	rest, err := regularfile.ReadExactly(f, path, info.Size()-8, -1)
	if err != nil {
		return nil, err
	}
	file, err := Decode(append(data, rest...))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	file.Path = path
	return file, nil
}

// checkHeaderLength bounds the JSON header that a file of size bytes may
// announce: at most maxHeader, and inside the file.
func checkHeaderLength(hlen uint64, size int64) error {
	if hlen > maxHeader || hlen > uint64(size-8) {
		return fmt.Errorf("not a safetensors file, or truncated: header of %d bytes in a %d-byte file", hlen, size)
	}
	return nil
}

// span is where a tensor's bytes lie in the data section.
type span struct {
	name       string
	begin, end int64
}

// Decode parses a safetensors image. Like the safetensors library, it
// requires the tensors' byte ranges, ordered by (begin, end), to tile the
// data section exactly: each starts where the previous one ends and the
// last ends at the end of the file. A zero-element tensor has an empty
// range [b, b), as PyTorch's writer gives it; ordering by both ends (then
// by name) puts it before a tensor that starts at b, whatever order the
// JSON object (read into a Go map) lists the entries in, so the result —
// and every error — is the same on every run.
func Decode(data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, errors.New("not a safetensors file: shorter than its 8-byte header size")
	}
	hlen := binary.LittleEndian.Uint64(data)
	if err := checkHeaderLength(hlen, int64(len(data))); err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+hlen], &raw); err != nil {
		return nil, fmt.Errorf("corrupt safetensors header: %v", err)
	}
	body := data[8+hlen:]
	f := &File{Metadata: map[string]string{}, byName: map[string]int{}}
	if m, ok := raw["__metadata__"]; ok {
		if err := json.Unmarshal(m, &f.Metadata); err != nil {
			return nil, fmt.Errorf("corrupt safetensors metadata: %v", err)
		}
		delete(raw, "__metadata__")
	}
	names := make([]string, 0, len(raw))
	for name := range raw {
		names = append(names, name)
	}
	sort.Strings(names)
	spans := make([]span, 0, len(names))
	tensors := make(map[string]Tensor, len(names))
	for _, name := range names {
		t, sp, err := decodeEntry(name, raw[name], int64(len(body)))
		if err != nil {
			return nil, err
		}
		t.Data = body[sp.begin:sp.end:sp.end]
		spans = append(spans, sp)
		tensors[name] = t
	}
	sort.Slice(spans, func(i, j int) bool {
		a, b := spans[i], spans[j]
		if a.begin != b.begin {
			return a.begin < b.begin
		}
		if a.end != b.end {
			return a.end < b.end
		}
		return a.name < b.name
	})
	if err := checkTiling(spans, int64(len(body))); err != nil {
		return nil, err
	}
	for i, sp := range spans { // file order, as written
		f.Tensors = append(f.Tensors, tensors[sp.name])
		f.byName[sp.name] = i
	}
	return f, nil
}

// decodeEntry checks one header entry: a known dtype, a shape whose
// element count does not overflow, and a byte range inside the data
// section holding exactly that shape.
func decodeEntry(name string, r json.RawMessage, bodyLen int64) (Tensor, span, error) {
	var e headerEntry
	if err := json.Unmarshal(r, &e); err != nil {
		return Tensor{}, span{}, fmt.Errorf("tensor %q: corrupt header entry: %v", name, err)
	}
	size, ok := e.DType.Size()
	if !ok {
		return Tensor{}, span{}, fmt.Errorf("tensor %q: unsupported dtype %q", name, e.DType)
	}
	elems := int64(1)
	for _, d := range e.Shape {
		if d < 0 || (d > 0 && elems > math.MaxInt64/d) {
			return Tensor{}, span{}, fmt.Errorf("tensor %q: bad shape %v", name, e.Shape)
		}
		elems *= d
	}
	b, en := e.DataOffsets[0], e.DataOffsets[1]
	if b < 0 || en < b || en > bodyLen {
		return Tensor{}, span{}, fmt.Errorf("tensor %q: data [%d, %d) lies outside the %d data bytes (truncated file?)", name, b, en, bodyLen)
	}
	if elems > math.MaxInt64/size || en-b != elems*size {
		return Tensor{}, span{}, fmt.Errorf("tensor %q: %d bytes do not hold shape %v of %s", name, en-b, e.Shape, e.DType)
	}
	shape := e.Shape
	if shape == nil {
		shape = []int64{}
	}
	return Tensor{Name: name, DType: e.DType, Shape: shape}, span{name, b, en}, nil
}

// checkTiling checks that the sorted spans cover [0, bodyLen) exactly,
// without a gap or an overlap, as the safetensors library requires.
func checkTiling(spans []span, bodyLen int64) error {
	var at int64
	prev := ""
	for _, sp := range spans {
		switch {
		case sp.begin < at:
			return fmt.Errorf("tensors %q and %q overlap", prev, sp.name)
		case sp.begin > at:
			return fmt.Errorf("tensor %q starts at data byte %d but the tensor before it ends at %d (a gap: not a safetensors layout)", sp.name, sp.begin, at)
		}
		at, prev = sp.end, sp.name
	}
	if at != bodyLen {
		return fmt.Errorf("the tensors end at data byte %d of %d (trailing bytes: not a safetensors layout)", at, bodyLen)
	}
	return nil
}

// RemoveStaleTemps deletes temporary files that a killed writer of path
// left behind (the checkpoint itself is never touched). Call it before a
// run starts writing path; it assumes no other process writes path.
func RemoveStaleTemps(path string) (int, error) {
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*"))
	if err != nil {
		return 0, err
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil {
			return 0, err
		}
	}
	return len(matches), nil
}
