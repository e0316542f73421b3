//go:build cuda

package cuda

import (
	"fmt"
	"time"

	"gorgonia.org/cu"
)

// TimeLaunches times the device work that run queues on the stream with
// CUDA events recorded before and after it (device.Timer): kernel time on
// the GPU, without the host's launch overhead or a sync per kernel.
func (d *Device) TimeLaunches(run func() error) (time.Duration, error) {
	var start, stop cu.Event
	err := d.do(func() error {
		var err error
		if start, err = cu.MakeEvent(cu.DefaultEvent); err != nil {
			return fmt.Errorf("cuda: cuEventCreate: %w", err)
		}
		if stop, err = cu.MakeEvent(cu.DefaultEvent); err != nil {
			return fmt.Errorf("cuda: cuEventCreate: %w", err)
		}
		return start.Record(d.stream)
	})
	if err != nil {
		return 0, err
	}
	defer d.do(func() error {
		cu.DestroyEvent(&start)
		cu.DestroyEvent(&stop)
		return nil
	})
	if err := run(); err != nil {
		return 0, err
	}
	var ms float64
	err = d.do(func() error {
		if err := stop.Record(d.stream); err != nil {
			return fmt.Errorf("cuda: cuEventRecord: %w", err)
		}
		if err := d.await(stop.Synchronize); err != nil {
			if w, ok := err.(watchStop); ok {
				return w.err
			}
			return fmt.Errorf("cuda: waiting for the timed kernels: %w", err)
		}
		var err error
		ms, err = start.Elapsed(stop)
		return err
	})
	return time.Duration(ms * float64(time.Millisecond)), err
}
