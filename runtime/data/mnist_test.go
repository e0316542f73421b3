package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
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
