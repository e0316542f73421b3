package cachefile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An entry lands whole in a folder made for it, leaving no temporary file;
// one that cannot be written is reported, not fatal.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "entry")
	require.True(t, Write(path, []byte("data")))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "data", string(got))
	left, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, left, 1, "no temporary file left behind")

	blocker := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	assert.False(t, Write(filepath.Join(blocker, "entry"), []byte("x")), "a folder that is a file")
}
