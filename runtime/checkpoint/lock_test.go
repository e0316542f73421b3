//go:build unix

package checkpoint_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// TestLockHolder is not a test: the other tests run the test binary as a
// second process that takes a checkpoint's lock, says so and waits.
func TestLockHolder(t *testing.T) {
	path := os.Getenv("CNNC_LOCK_HOLDER")
	if path == "" {
		t.Skip("helper process")
	}
	l, err := checkpoint.Acquire(path, "the lock test's holder")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin or kills us
	l.Release()
	os.Exit(0)
}

// holder starts a process holding path's lock.
func holder(t *testing.T, path string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHolder$")
	cmd.Env = append(os.Environ(), "CNNC_LOCK_HOLDER="+path)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "locked\n", line)
	return cmd
}

// One writer per checkpoint: a second is refused, naming the first (pid
// and host); once the first is gone — even killed — the lock is free, and
// the temporary files it left can be removed.
func TestOneWriterPerCheckpoint(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	other := holder(t, path)
	_, err := checkpoint.Acquire(path, "a test")
	require.Error(t, err)
	host, _ := os.Hostname()
	assert.Contains(t, err.Error(), fmt.Sprintf("%s is being written by pid %d on host %s since ", path, other.Process.Pid, host))
	assert.Contains(t, err.Error(), "the lock test's holder; stop that process or choose another checkpoint file")

	// killed, as by kill -9, with a temporary file half written
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".m.safetensors.tmp-123"), []byte("half"), 0o644))
	require.NoError(t, other.Process.Kill())
	other.Wait()
	l, err := checkpoint.Acquire(path, "a test")
	require.NoError(t, err)
	n, err := checkpoint.RemoveStaleTemps(path)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	lockFile, err := os.ReadFile(filepath.Join(dir, ".m.safetensors.lock"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(lockFile), fmt.Sprintf("pid %d on host ", os.Getpid())), string(lockFile))
	// within one process too
	_, err = checkpoint.Acquire(path, "a test")
	assert.ErrorContains(t, err, "is being written by")
	require.NoError(t, l.Release())
	assert.NoFileExists(t, filepath.Join(dir, ".m.safetensors.lock"))
	l, err = checkpoint.Acquire(path, "a test")
	require.NoError(t, err)
	require.NoError(t, l.Release())
}

// A checkpoint folder that is missing or cannot be written is found when
// the lock is taken: before any training.
func TestLockNeedsAWritableFolder(t *testing.T) {
	dir := t.TempDir()
	_, err := checkpoint.Acquire(filepath.Join(dir, "nowhere", "m.safetensors"), "a test")
	assert.EqualError(t, err, filepath.Join(dir, "nowhere", "m.safetensors")+": the folder "+filepath.Join(dir, "nowhere")+" does not exist")
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = checkpoint.Acquire(filepath.Join(file, "m.safetensors"), "a test")
	assert.ErrorContains(t, err, "cannot write in the folder "+file+": not a directory")
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		require.NoError(t, os.Mkdir(ro, 0o555))
		_, err = checkpoint.Acquire(filepath.Join(ro, "m.safetensors"), "a test")
		assert.ErrorContains(t, err, "cannot write in the folder "+ro+": permission denied")
	}
}
