package checkpoint

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// FuzzRead reads arbitrary bytes as a checkpoint file. Either the error
// names the file, or what was read is consistent with the header: every
// tensor holds exactly its shape's bytes, the tensors tile the data
// section in file order, names are unique and found by Tensor, and
// Encode writes back a file that decodes to the same tensors. Allocation
// stays proportional to the input (the header is never trusted for a
// size), and decoding again gives the same result.
func FuzzRead(f *testing.F) {
	var b bytes.Buffer
	ts, meta := sample()
	if err := Encode(&b, ts, meta); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes())
	f.Add(pytorchLayout())
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 2), "{}"...))
	dir := f.TempDir()
	path := filepath.Join(dir, "fuzz.safetensors")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		file, err := Read(path)
		runtime.ReadMemStats(&after)
		// JSON decoding allocates a small multiple of the header.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(64*len(data)+1<<20) {
			t.Fatalf("reading %d bytes allocated %d", len(data), alloc)
		}
		again, err2 := Decode(data)
		if (err == nil) != (err2 == nil) || (err != nil && err.Error() != path+": "+err2.Error()) {
			t.Fatalf("two reads differ: %v / %v", err, err2)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), path+": ") {
				t.Fatalf("error does not start with the path: %v", err)
			}
			return
		}
		hlen := binary.LittleEndian.Uint64(data)
		at := 8 + int(hlen)
		for i, tn := range file.Tensors {
			size, ok := tn.DType.Size()
			if !ok || int64(len(tn.Data)) != size*tn.Elems() {
				t.Fatalf("tensor %q: %d bytes for %v of %s", tn.Name, len(tn.Data), tn.Shape, tn.DType)
			}
			if !bytes.Equal(tn.Data, data[at:at+len(tn.Data)]) {
				t.Fatalf("tensor %q is not the bytes at %d", tn.Name, at)
			}
			at += len(tn.Data)
			if got, ok := file.Tensor(tn.Name); !ok || got.Name != tn.Name {
				t.Fatalf("Tensor(%q) does not find it", tn.Name)
			}
			if again.Tensors[i].Name != tn.Name {
				t.Fatalf("order differs between reads: %q / %q", tn.Name, again.Tensors[i].Name)
			}
		}
		if at != len(data) {
			t.Fatalf("tensors end at %d of %d bytes", at, len(data))
		}
		var out bytes.Buffer
		if err := Encode(&out, file.Tensors, file.Metadata); err != nil {
			t.Fatalf("cannot write back what was read: %v", err)
		}
		back, err := Decode(out.Bytes())
		if err != nil {
			t.Fatalf("cannot read back what was written: %v", err)
		}
		if len(back.Tensors) != len(file.Tensors) {
			t.Fatalf("round trip: %d tensors, want %d", len(back.Tensors), len(file.Tensors))
		}
		for i := range back.Tensors {
			a, b := back.Tensors[i], file.Tensors[i]
			if a.Name != b.Name || a.DType != b.DType || !bytes.Equal(a.Data, b.Data) || len(a.Shape) != len(b.Shape) {
				t.Fatalf("round trip changed tensor %q", b.Name)
			}
		}
	})
}
