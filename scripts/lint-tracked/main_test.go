package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckFindsBinariesAndLargeFiles(t *testing.T) {
	dir := t.TempDir()
	pe := make([]byte, 0x80)
	copy(pe, "MZ")
	binary.LittleEndian.PutUint32(pe[0x3c:], 0x40)
	copy(pe[0x40:], "PE\x00\x00")
	files := map[string][]byte{
		"README.md":                  []byte("# text\n"),
		"cmd/cnnc/trainer":           append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 64)...),
		"bin/tool":                   {0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0, 1},
		"tool.exe":                   pe,
		"blob.dat":                   []byte("text\x00more"),
		"big.txt":                    bytes.Repeat([]byte("a"), maxBytes+1),
		"exactly1MB.txt":             bytes.Repeat([]byte("a"), maxBytes),
		"runtime/data/testdata/x.pn": append([]byte("\x89PNG\x00"), bytes.Repeat([]byte{0}, maxBytes)...),
		"MZ.txt":                     []byte("MZ is fine as text\n"),
	}
	var names []string
	for name, b := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
		names = append(names, name)
	}
	names = append(names, "deleted.go")
	assert.ElementsMatch(t, []string{
		"cmd/cnnc/trainer: an ELF executable",
		"bin/tool: a Mach-O executable",
		"tool.exe: a PE executable",
		"blob.dat: binary (a NUL byte at offset 4)",
		"big.txt: 1048577 bytes, over the 1 MB limit",
	}, check(dir, names))
}

// The repository itself passes.
func TestRepositoryHasNoTrackedBinaries(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	files, err := tracked(root)
	if err != nil {
		t.Skipf("not a git work tree: %v", err)
	}
	require.NotEmpty(t, files)
	assert.Empty(t, check(root, files))
}
