package regularfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withTimeout fails the test instead of hanging when fn blocks (an open of
// a FIFO without a writer would).
func withTimeout(t *testing.T, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("blocked for 10 s")
		return nil
	}
}

func TestNonRegularFilesAreRefusedByName(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	zero := filepath.Join(dir, "zero.png")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	for _, tc := range []struct{ path, kind string }{
		{fifo, "is a named pipe (FIFO), not a regular file"},
		{zero, "is a character device, not a regular file"},
		{dir, "is a folder, not a regular file"},
	} {
		err := withTimeout(t, func() error { _, _, err := ReadAll(tc.path, -1); return err })
		require.Error(t, err, tc.path)
		assert.Equal(t, "open "+tc.path+": "+tc.kind, err.Error())
		assert.True(t, errors.Is(err, ErrNotRegular))
		var pe *fs.PathError
		require.True(t, errors.As(err, &pe))
		assert.Equal(t, tc.path, pe.Path)
	}
}

func TestReadAllIsBoundedByTheFileAndTheLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte("hello"), 0o644))
	b, info, err := ReadAll(p, 5)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b))
	assert.Equal(t, int64(5), info.Size())
	_, _, err = ReadAll(p, 4)
	var tl *TooLargeError
	require.True(t, errors.As(err, &tl), "%v", err)
	assert.Equal(t, int64(5), tl.Size)
	assert.ErrorContains(t, err, p)

	_, _, err = ReadAll(filepath.Join(t.TempDir(), "missing"), -1)
	assert.True(t, errors.Is(err, fs.ErrNotExist))
}

// A file that is not the size fstat said when it is read is an error: a
// reader never takes more bytes than it sized its buffer for.
func TestReadExactlyNoticesAChangedFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte("hello world"), 0o644))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	_, err = ReadExactly(f, p, 5, -1)
	assert.ErrorContains(t, err, p+": changed while being read (grew past 5 bytes)")
	_, err = f.Seek(0, 0)
	require.NoError(t, err)
	_, err = ReadExactly(f, p, 20, -1)
	assert.ErrorContains(t, err, p+": changed while being read (20 bytes expected)")
}
