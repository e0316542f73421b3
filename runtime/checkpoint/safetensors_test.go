package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sample() ([]Tensor, map[string]string) {
	return []Tensor{
			F32Tensor("conv1.weight", []int64{2, 1, 2, 2}, []float32{1, 2, 3, 4, 5, 6, 7, 8}),
			F32Tensor("conv1.bias", []int64{2}, []float32{-1, 0.5}),
			{Name: "labels", DType: I32, Shape: []int64{3}, Data: []byte{1, 0, 0, 0, 2, 0, 0, 0, 255, 255, 255, 255}},
			F32Tensor("loss", []int64{}, []float32{0.25}),
		}, map[string]string{
			"step": "7", "format": "cnnc",
		}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt.safetensors")
	ts, meta := sample()
	require.NoError(t, Write(path, ts, meta))
	f, err := Read(path)
	require.NoError(t, err)
	assert.Equal(t, meta, f.Metadata)
	require.Len(t, f.Tensors, len(ts))
	for i, want := range ts {
		got := f.Tensors[i]
		assert.Equal(t, want.Name, got.Name, "file order is write order")
		assert.Equal(t, want.DType, got.DType)
		assert.Equal(t, want.Data, got.Data)
		if len(want.Shape) == 0 {
			assert.Empty(t, got.Shape)
		} else {
			assert.Equal(t, want.Shape, got.Shape)
		}
	}
	w, err := f.Expect("conv1.weight", F32, []int64{2, 1, 2, 2})
	require.NoError(t, err)
	assert.Equal(t, []float32{1, 2, 3, 4, 5, 6, 7, 8}, w.Float32s())
}

// The bytes on disk follow the safetensors specification field by field:
// u64 little-endian header length, a JSON header of {name: {dtype, shape,
// data_offsets}} plus __metadata__, padded to 8 bytes, then the raw data.
func TestLayoutFollowsTheSpecification(t *testing.T) {
	var b bytes.Buffer
	ts, meta := sample()
	require.NoError(t, Encode(&b, ts, meta))
	data := b.Bytes()
	n := binary.LittleEndian.Uint64(data)
	assert.Zero(t, (8+n)%8, "data starts 8-byte aligned")
	var header map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(data[8:8+n], &header))
	var m map[string]string
	require.NoError(t, json.Unmarshal(header["__metadata__"], &m))
	assert.Equal(t, meta, m)
	type entry struct {
		DType       string  `json:"dtype"`
		Shape       []int64 `json:"shape"`
		DataOffsets []int64 `json:"data_offsets"`
	}
	var w entry
	require.NoError(t, json.Unmarshal(header["conv1.weight"], &w))
	assert.Equal(t, entry{"F32", []int64{2, 1, 2, 2}, []int64{0, 32}}, w)
	var bias entry
	require.NoError(t, json.Unmarshal(header["conv1.bias"], &bias))
	assert.Equal(t, entry{"F32", []int64{2}, []int64{32, 40}}, bias)
	var scalar entry
	require.NoError(t, json.Unmarshal(header["loss"], &scalar))
	assert.Equal(t, []int64{}, scalar.Shape, "a scalar has shape []")
	body := data[8+n:]
	assert.Equal(t, uint32(0x3f800000), binary.LittleEndian.Uint32(body[0:]), "1.0f little-endian")
	assert.Len(t, body, 40+12+4)
}

func TestCorruptFilesAreClearErrors(t *testing.T) {
	var b bytes.Buffer
	ts, meta := sample()
	require.NoError(t, Encode(&b, ts, meta))
	good := b.Bytes()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	hdr := func(js string) []byte {
		var out []byte
		out = binary.LittleEndian.AppendUint64(out, uint64(len(js)))
		return append(out, js...)
	}
	cases := map[string]struct {
		data []byte
		want string
	}{
		"empty":       {nil, "shorter than its 8-byte header size"},
		"truncated":   {good[:len(good)-5], `data [`},
		"huge header": {binary.LittleEndian.AppendUint64(nil, 1<<40), "header of"},
		"bad json":    {hdr("{nope"), "corrupt safetensors header"},
		"bad dtype":   {hdr(`{"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}}`), `tensor "a": unsupported dtype "F8"`},
		"bad size":    {append(hdr(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`), 0, 0, 0, 0), `tensor "a": 4 bytes do not hold shape [2] of F32`},
		"overlap": {append(hdr(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`), make([]byte, 8)...),
			"overlap"},
	}
	for name, c := range cases {
		p := write(name, c.data)
		_, err := Read(p)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), p, name)
		assert.Contains(t, err.Error(), c.want, name)
	}
	f, err := Decode(good)
	require.NoError(t, err)
	f.Path = "x.safetensors"
	_, err = f.Expect("fc1.weight", F32, []int64{1})
	assert.EqualError(t, err, `x.safetensors: no tensor "fc1.weight" (is this a checkpoint of another model?)`)
	_, err = f.Expect("conv1.weight", F32, []int64{2, 1, 3, 3})
	assert.EqualError(t, err, `x.safetensors: tensor "conv1.weight" has shape [2 1 2 2], the model needs [2 1 3 3]`)
	_, err = f.Expect("labels", F32, []int64{3})
	assert.EqualError(t, err, `x.safetensors: tensor "labels" is I32, want F32`)
}

func TestEncodeRejectsBadTensors(t *testing.T) {
	var b bytes.Buffer
	assert.Error(t, Encode(&b, []Tensor{{Name: "a", DType: F32, Shape: []int64{2}, Data: []byte{1}}}, nil))
	assert.Error(t, Encode(&b, []Tensor{F32Tensor("a", nil, []float32{1}), F32Tensor("a", nil, []float32{1})}, nil))
	assert.Error(t, Encode(&b, []Tensor{{Name: "a", DType: "BF16"}}, nil))
}

// A process killed with SIGKILL while it writes checkpoints leaves the
// previous checkpoint intact: the file at the path is always a complete one.
func TestKillDuringWriteKeepsTheOldCheckpoint(t *testing.T) {
	if os.Getenv("CNNC_CHECKPOINT_WRITER") != "" {
		writeForever(os.Getenv("CNNC_CHECKPOINT_WRITER"))
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "ckpt.safetensors")
	require.NoError(t, Write(path, bigTensors(0), map[string]string{"gen": "0"}))
	for round := 0; round < 5; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillDuringWriteKeepsTheOldCheckpoint$")
		cmd.Env = append(os.Environ(), "CNNC_CHECKPOINT_WRITER="+path)
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(30+round*37) * time.Millisecond)
		require.NoError(t, cmd.Process.Kill())
		cmd.Wait()
		f, err := Read(path)
		require.NoError(t, err, "round %d: the checkpoint must be readable after kill -9", round)
		gen, err := strconv.Atoi(f.Metadata["gen"])
		require.NoError(t, err)
		w, err := f.Expect("w", F32, []int64{1 << 18})
		require.NoError(t, err)
		vals := w.Float32s()
		assert.Equal(t, float32(gen), vals[0])
		assert.Equal(t, float32(gen), vals[len(vals)-1], "no torn write")
	}
	n, err := RemoveStaleTemps(path)
	require.NoError(t, err)
	t.Logf("removed %d temporary files left by killed writers", n)
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	assert.Equal(t, []string{path}, left)
}

func bigTensors(gen int) []Tensor {
	vals := make([]float32, 1<<18)
	for i := range vals {
		vals[i] = float32(gen)
	}
	return []Tensor{F32Tensor("w", []int64{1 << 18}, vals)}
}

func writeForever(path string) {
	for gen := 1; ; gen++ {
		if err := Write(path, bigTensors(gen), map[string]string{"gen": fmt.Sprint(gen)}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
	}
}

// pytorchLayout is a checkpoint laid out as the safetensors library lays
// out PyTorch's state dicts (tensors of one dtype sorted by name, offsets
// assigned in that order, __metadata__ first, header padded with spaces
// to 8 bytes), with zero-element tensors first, in the middle and last:
// their empty ranges [b, b) start where a neighbour starts or ends.
func pytorchLayout() []byte {
	header := `{"__metadata__":{"format":"pt"},` +
		`"a.empty":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},` +
		`"b.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},` +
		`"m.empty":{"dtype":"F32","shape":[3,0],"data_offsets":[16,16]},` +
		`"n.weight":{"dtype":"F32","shape":[4],"data_offsets":[16,32]},` +
		`"z.empty":{"dtype":"F32","shape":[0,5],"data_offsets":[32,32]}}`
	for len(header)%8 != 0 {
		header += " "
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	for i := range 8 {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(i+1)))
	}
	return out
}

// Go randomises map iteration; the header is read into a map. Every run
// must give the same tensors in the same order.
func TestZeroElementTensorsLoadTheSameOnEveryRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pt.safetensors")
	require.NoError(t, os.WriteFile(path, pytorchLayout(), 0o644))
	for run := range 200 {
		f, err := Read(path)
		require.NoError(t, err, "run %d", run)
		var names []string
		for _, ts := range f.Tensors {
			names = append(names, ts.Name)
		}
		require.Equal(t, []string{"a.empty", "b.weight", "m.empty", "n.weight", "z.empty"}, names, "run %d", run)
		e, err := f.Expect("m.empty", F32, []int64{3, 0})
		require.NoError(t, err)
		assert.Empty(t, e.Data)
		w, err := f.Expect("n.weight", F32, []int64{4})
		require.NoError(t, err)
		assert.Equal(t, []float32{5, 6, 7, 8}, w.Float32s())
	}
	// Written back by Encode and read again: the same tensors.
	f, err := Read(path)
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, Encode(&b, f.Tensors, f.Metadata))
	g, err := Decode(b.Bytes())
	require.NoError(t, err)
	assert.Equal(t, f.Tensors, g.Tensors)
}

// A layout with a gap or trailing bytes is not safetensors (the library
// refuses it); neither is one whose ranges overlap only through a tie.
func TestRangesMustTileTheData(t *testing.T) {
	hdr := func(js string, data int) []byte {
		out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
		return append(append(out, js...), make([]byte, data)...)
	}
	for _, tc := range []struct {
		name, js string
		data     int
		want     string
	}{
		{"gap", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}`, 5,
			`tensor "b" starts at data byte 3 but the tensor before it ends at 2`},
		{"trailing", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 3, "the tensors end at data byte 2 of 3"},
		{"leading gap", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, 3, `tensor "a" starts at data byte 1`},
		{"same start", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 2,
			`tensors "b" and "a" overlap`},
	} {
		for range 20 {
			_, err := Decode(hdr(tc.js, tc.data))
			require.Error(t, err, tc.name)
			require.Contains(t, err.Error(), tc.want, tc.name)
		}
	}
}

// --resume /dev/zero, a FIFO or a folder: refused by name at once.
func TestNonRegularCheckpointPathsAreRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ck.fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	zero := filepath.Join(dir, "zero.safetensors")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	for _, tc := range []struct{ path, kind string }{
		{"/dev/zero", "a character device"},
		{zero, "a character device"},
		{fifo, "a named pipe (FIFO)"},
		{dir, "a folder"},
	} {
		done := make(chan error, 1)
		go func() { _, err := Read(tc.path); done <- err }()
		select {
		case err := <-done:
			require.Error(t, err, tc.path)
			assert.Contains(t, err.Error(), tc.path+": is "+tc.kind+", not a regular file")
		case <-time.After(10 * time.Second):
			t.Fatalf("Read(%s) blocked", tc.path)
		}
	}
	// Writing never replaces a FIFO or a folder with a checkpoint.
	ts, meta := sample()
	err := Write(fifo, ts, meta)
	assert.EqualError(t, err, "checkpoint "+fifo+": is a named pipe (FIFO), not a regular file")
	st, statErr := os.Lstat(fifo)
	require.NoError(t, statErr)
	assert.NotZero(t, st.Mode()&os.ModeNamedPipe, "still the FIFO")
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	assert.EqualError(t, Write(sub, ts, meta), "checkpoint "+sub+": is a folder, not a regular file")
	left, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
	assert.Empty(t, left)
}

// A header length beyond the file is refused before the header is read;
// a file is never read past the size it had when opened.
func TestReadIsBoundedByTheFileSize(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "claims.safetensors")
	// 16 bytes claiming a 64 MiB header: refused from the 8 bytes.
	b := binary.LittleEndian.AppendUint64(nil, 64<<20)
	require.NoError(t, os.WriteFile(p, append(b, "{}      "...), 0o644))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Read(p)
	runtime.ReadMemStats(&after)
	assert.EqualError(t, err, p+": not a safetensors file, or truncated: header of 67108864 bytes in a 16-byte file")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "nothing near the claimed size was allocated")
}
