package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/datasets"
)

func writeIDX(t *testing.T, path string, hdr []uint32, payload []byte, gz bool) {
	var b bytes.Buffer
	require.NoError(t, binary.Write(&b, binary.BigEndian, hdr))
	b.Write(payload)
	data := b.Bytes()
	if gz {
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(data)
		w.Close()
		data = z.Bytes()
	}
	require.NoError(t, os.WriteFile(path, data, 0o644))
}

func TestLoadMNISTFromTheGoMNISTModule(t *testing.T) {
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	test, err := LoadMNIST(dir, "t10k")
	require.NoError(t, err)
	assert.Equal(t, 10000, test.Images.N)
	assert.Equal(t, 28, test.Images.H)
	assert.Equal(t, uint8(7), test.Labels[0], "the first test digit is a 7")
	// a 7 has ink in the middle rows
	ink := 0
	for _, p := range test.Images.Image(0) {
		if p > 128 {
			ink++
		}
	}
	assert.Greater(t, ink, 50)
}

func TestIDXErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x-images-idx3-ubyte")

	writeIDX(t, p, []uint32{0x803, 2, 2, 2}, []byte{1, 2, 3, 4, 5, 6, 7, 8}, false)
	im, err := ReadIDXImages(p)
	require.NoError(t, err)
	assert.Equal(t, []uint8{5, 6, 7, 8}, im.Image(1))

	writeIDX(t, p+".gz", []uint32{0x803, 2, 2, 2}, []byte{1, 2, 3}, true)
	_, err = ReadIDXImages(p + ".gz")
	assert.ErrorContains(t, err, p+".gz: file ends before its 2 images")

	writeIDX(t, p, []uint32{0x801, 2}, nil, false)
	_, err = ReadIDXImages(p)
	assert.ErrorContains(t, err, p+": not an IDX image file")

	require.NoError(t, os.WriteFile(p, []byte{0, 0}, 0o644))
	_, err = ReadIDXImages(p)
	assert.ErrorContains(t, err, p+": truncated IDX header")

	require.NoError(t, os.WriteFile(p+".gz", []byte("not gzip"), 0o644))
	_, err = ReadIDXImages(p + ".gz")
	assert.ErrorContains(t, err, p+".gz: not a gzip file")

	_, err = LoadMNIST(dir, "train")
	assert.ErrorContains(t, err, dir+": no MNIST images-idx3-ubyte file")

	writeIDX(t, p, []uint32{0x803, 2, 2, 2}, []byte{1, 2, 3, 4, 5, 6, 7, 8}, false)
	l := filepath.Join(dir, "x-labels-idx1-ubyte")
	writeIDX(t, l, []uint32{0x801, 3}, []byte{1, 2, 11}, false)
	_, err = LoadMNIST(dir, "x")
	assert.ErrorContains(t, err, "has 2 images but")
	writeIDX(t, l, []uint32{0x801, 2}, []byte{1, 11}, false)
	_, err = LoadMNIST(dir, "x")
	assert.ErrorContains(t, err, l+": label 11 of sample 1 is not a digit")
}

// A header's counts are checked against the file before anything is
// allocated: a 16-byte file claiming 2^28 images of 28x28 (210 GB) is an
// error naming it, not an out-of-memory crash; so is a gzip file claiming
// more than deflate can expand its bytes to.
func TestIDXCountsAreCheckedAgainstTheFileSize(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x-images-idx3-ubyte")
	l := filepath.Join(dir, "x-labels-idx1-ubyte")
	allocated := func(fn func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fn()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	for _, tc := range []struct {
		name, path string
		hdr        []uint32
		payload    []byte
		gz         bool
		want       string
	}{
		{"2^28 images", p, []uint32{0x803, 1 << 28, 28, 28}, nil, false,
			p + ": file ends before its 268435456 images: the header announces 210453397504 bytes of data, the file holds 0"},
		{"2^28 labels", l, []uint32{0x801, 1 << 28}, []byte{1}, false,
			l + ": file ends before its 268435456 labels: the header announces 268435456 bytes of data, the file holds 1"},
		{"gzip", p + ".gz", []uint32{0x803, 1 << 28, 28, 28}, make([]byte, 100), true,
			p + ".gz: the header announces 268435456 images (210453397504 bytes), more than a "},
		// 2^32-1 squared overflows 64 bits: each side is checked first.
		{"overflow", p, []uint32{0x803, 1, 1<<32 - 1, 1<<32 - 1}, nil, false,
			p + ": implausible IDX dimensions 1x4294967295x4294967295"},
		{"trailing", p, []uint32{0x803, 1, 2, 2}, []byte{1, 2, 3, 4, 5}, false,
			p + ": 1 bytes follow its 1 images: the header announces 4 bytes of data, the file holds 5"},
		{"gzip trailing", l + ".gz", []uint32{0x801, 2}, []byte{1, 2, 3}, true,
			l + ".gz: data follows its 2 labels"},
	} {
		writeIDX(t, tc.path, tc.hdr, tc.payload, tc.gz)
		var err error
		alloc := allocated(func() {
			if tc.hdr[0] == 0x803 {
				_, err = ReadIDXImages(tc.path)
			} else {
				_, err = ReadIDXLabels(tc.path)
			}
		})
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
		assert.Less(t, alloc, uint64(1<<20), "%s: allocated %d bytes", tc.name, alloc)
		require.NoError(t, os.Remove(tc.path))
	}
}

// MNIST files that link to /dev/zero or are FIFOs are refused by name,
// at once.
func TestIDXNonRegularFilesAreRefused(t *testing.T) {
	dir := t.TempDir()
	images := filepath.Join(dir, "train-images-idx3-ubyte")
	labels := filepath.Join(dir, "train-labels-idx1-ubyte")
	require.NoError(t, os.Symlink("/dev/zero", images))
	require.NoError(t, syscall.Mkfifo(labels, 0o644))
	err := notBlocking(t, func() error { _, err := LoadMNIST(dir, "train"); return err })
	assert.EqualError(t, err, "open "+images+": is a character device, not a regular file")
	err = notBlocking(t, func() error { _, err := ReadIDXLabels(labels); return err })
	assert.EqualError(t, err, "open "+labels+": is a named pipe (FIFO), not a regular file")
}
