//go:build cuda

package cuda_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/cu"
)

// A data-parallel rank's device waits are watched under WatchWaits: the check runs before the
// wait blocks and once more after the work is done, and its error ends every host wait — Sync,
// a fence's Wait, a copy that waits — as it is. Without a check the waits only block.
func TestWatchedWaits(t *testing.T) {
	d := open(t, testFatbin(t))
	p, err := d.Alloc(64)
	require.NoError(t, err)
	f, err := d.NewFence(false)
	require.NoError(t, err)
	defer f.Close()

	calls := 0
	require.NoError(t, d.WatchWaits(func() error { calls++; return nil }))
	require.NoError(t, d.Sync())
	assert.GreaterOrEqual(t, calls, 2, "before the first poll and after the work is done")
	require.NoError(t, f.Record())
	before := calls
	require.NoError(t, f.Wait())
	assert.Greater(t, calls, before, "a fence's wait is watched too")

	gone := errors.New("rank 1 (host, pid 42) is gone")
	require.NoError(t, d.WatchWaits(func() error { return gone }))
	assert.Equal(t, gone, d.Sync(), "the check's error as it is")
	assert.Equal(t, gone, f.Wait())
	assert.Equal(t, gone, d.CopyOut(make([]byte, 64), p))

	require.NoError(t, d.WatchWaits(nil))
	require.NoError(t, d.Sync())
	require.NoError(t, f.Wait())
}

// OffThread runs its function on a thread of its own with the device's context current, while
// the device's thread is busy — here waiting for that very function, as the device's thread
// waits in a collective that only an abort from elsewhere ends.
func TestOffThreadRunsBesideABusyDevice(t *testing.T) {
	d := open(t, testFatbin(t))
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free() // a failed test still lets the device close
	busy := make(chan error, 1)
	go func() {
		busy <- d.OnStream(func(uintptr) error {
			<-release
			return nil
		})
	}()
	time.Sleep(50 * time.Millisecond) // let the device's thread block (the test holds either way)
	off := make(chan error, 1)
	go func() {
		off <- d.OffThread(func() error {
			defer free()
			ctx, err := cu.CurrentContext()
			if err != nil {
				return err
			}
			if ctx == (cu.CUContext{}) {
				return errors.New("no context is current on OffThread's thread")
			}
			return nil
		})
	}()
	select {
	case err := <-off:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("OffThread still waits 10 s later: for the busy device's thread?")
	}
	select {
	case err := <-busy:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the device's thread still waits 10 s after OffThread released it")
	}
}
