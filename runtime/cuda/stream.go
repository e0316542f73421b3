//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/cnnc/cnnc/runtime/device"
)

// OnStream runs f on the device's thread — the one where the device's context is current and
// every driver call of the device is made — with the device's stream, a CUstream as an
// address. It is the way for a library that enqueues work of its own, such as NCCL's
// collectives (runtime/nccl), to order that work with the device's launches and copies, from
// the thread NCCL requires. f must not call the device's methods: they wait for this thread.
func (d *Device) OnStream(f func(stream uintptr) error) error {
	return d.do(func() error {
		// cu.Stream holds only a CUstream (checked at compile time in graph.go)
		return f(*(*uintptr)(unsafe.Pointer(&d.stream)))
	})
}

var _ device.SideStreamer = (*Device)(nil)

// sideStream is a second stream of the device (device.SideStream): ready
// is the event the device's stream records and the side stream waits for
// (one is enough: cuStreamWaitEvent waits for the record made before the
// call, so recording it again later changes no wait already queued);
// marks are the side stream's events that the device's stream waits for.
type sideStream struct {
	d      *Device
	stream cu.Stream
	ready  cu.Event
	marks  []cu.Event
}

// NewSideStream makes a non-blocking stream and its events (without
// timing, which makes waiting for them cheaper).
func (d *Device) NewSideStream(marks int) (device.SideStream, error) {
	if marks < 0 {
		return nil, fmt.Errorf("cuda: a side stream with %d marks", marks)
	}
	s := &sideStream{d: d}
	err := d.do(func() error {
		var err error
		if s.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
			return fmt.Errorf("cuda: cuStreamCreate: %w", err)
		}
		events := make([]cu.Event, marks+1)
		for i := range events {
			if events[i], err = cu.MakeEvent(cu.DisableTiming); err != nil {
				s.marks = events[:i]
				return errors.Join(fmt.Errorf("cuda: cuEventCreate: %w", err), s.destroy())
			}
		}
		s.ready, s.marks = events[0], events[1:]
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// WaitForDevice records ready on the device's stream and makes the side
// stream wait for it.
func (s *sideStream) WaitForDevice() error {
	return s.d.do(func() error { return order(s.ready, s.d.stream, s.stream) })
}

// Run calls f on the device's thread with the side stream.
func (s *sideStream) Run(f func(stream uintptr) error) error {
	return s.d.do(func() error { return f(*(*uintptr)(unsafe.Pointer(&s.stream))) })
}

// Mark records event i on the side stream.
func (s *sideStream) Mark(i int) error {
	if i < 0 || i >= len(s.marks) {
		return fmt.Errorf("cuda: mark %d of a side stream with %d", i, len(s.marks))
	}
	return s.d.do(func() error {
		if err := s.marks[i].Record(s.stream); err != nil {
			return fmt.Errorf("cuda: cuEventRecord: %w", err)
		}
		return nil
	})
}

// DeviceWaits makes the device's stream wait for event i.
func (s *sideStream) DeviceWaits(i int) error {
	if i < 0 || i >= len(s.marks) {
		return fmt.Errorf("cuda: mark %d of a side stream with %d", i, len(s.marks))
	}
	return s.d.do(func() error {
		if err := s.d.stream.Wait(s.marks[i], 0); err != nil {
			return fmt.Errorf("cuda: cuStreamWaitEvent: %w", err)
		}
		return nil
	})
}

// order makes the work queued next on to wait for the work queued on from
// so far, through e.
func order(e cu.Event, from, to cu.Stream) error {
	if err := e.Record(from); err != nil {
		return fmt.Errorf("cuda: cuEventRecord: %w", err)
	}
	if err := to.Wait(e, 0); err != nil {
		return fmt.Errorf("cuda: cuStreamWaitEvent: %w", err)
	}
	return nil
}

// Close waits for the work queued on the stream (watched under
// WatchWaits: a failed job's collective ends only when the watchdog
// aborts it), then destroys it and its events.
func (s *sideStream) Close() error {
	return s.d.do(func() error {
		err := s.d.await(s.stream.Synchronize)
		if w, ok := err.(watchStop); ok {
			err = w.err
		}
		return errors.Join(err, s.destroy())
	})
}

// destroy destroys the stream and the events made (on the device's thread).
func (s *sideStream) destroy() error {
	var errs []error
	for _, e := range append([]cu.Event{s.ready}, s.marks...) {
		if e != (cu.Event{}) {
			errs = append(errs, cu.DestroyEvent(&e))
		}
	}
	return errors.Join(append(errs, s.stream.Destroy())...)
}
