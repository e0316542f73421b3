package nccl

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/runtime/device"
)

// BroadcastGroup queues its broadcasts in one NCCL group, through On with
// On's stream: none has run when queue returns (the fake libnccl runs a
// group's collectives at ncclGroupEnd), every one has when BroadcastGroup
// returns — each from its own root.
func TestBroadcastGroupQueuesOneGroupThroughOn(t *testing.T) {
	comms := inProcess(t, 2)
	const n = 16
	bufs := [2][2]buffer{}
	for r := range 2 {
		for k := range 2 {
			bufs[r][k] = hostBuffer(4 * n)
			for i := range bufs[r][k].b {
				bufs[r][k].b[i] = byte(10*r + k + 1)
			}
		}
	}
	var wg sync.WaitGroup
	errs, ons, pending := make([]error, 2), make([]int, 2), make([]bool, 2)
	for r := range 2 {
		red := Reducer{Comm: comms[r], On: func(f func(uintptr) error) error {
			ons[r]++
			return f(0)
		}}
		wg.Go(func() {
			errs[r] = red.BroadcastGroup(func(broadcast func(from, to device.Ptr, count, root int) error) error {
				for k := range 2 { // buffer k from rank k
					b := device.Ptr(bufs[r][k].addr)
					if err := broadcast(b, b, n, k); err != nil {
						return err
					}
				}
				// queued, not run: the received buffer still holds this rank's bytes
				pending[r] = bufs[r][1-r].b[0] == byte(10*r+(1-r)+1)
				return nil
			})
		})
	}
	wg.Wait()
	for r := range 2 {
		require.NoError(t, errs[r], "rank %d", r)
		assert.Equal(t, 1, ons[r], "rank %d queues through On once", r)
		assert.True(t, pending[r], "rank %d's broadcasts wait for the group's end", r)
		for k := range 2 {
			assert.Equal(t, bufs[k][k].b, bufs[r][k].b, "rank %d holds buffer %d of rank %d", r, k, k)
		}
	}
	assert.Equal(t, byte(1), bufs[1][0].b[0])
	assert.Equal(t, byte(12), bufs[0][1].b[0])
}
