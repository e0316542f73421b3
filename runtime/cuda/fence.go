//go:build cuda

package cuda

// Fences (device.Fencer) are CUDA events. The trainer records one at the
// end of each step — inside the step's graph, as an event record node, so
// that recording it costs no call of its own — and waits for the fence of
// the step two back before refilling that step's staging buffer.

/*
#cgo LDFLAGS: -lcuda
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo linux CFLAGS: -I/usr/local/cuda/include -I/usr/include

#include <cuda.h>

// cnncRecordInCapture records e on s while s captures: the graph gets an
// event record node, which records e each time the graph runs (CUDA 11.1).
static CUresult cnncRecordInCapture(CUevent e, CUstream s) {
	return cuEventRecordWithFlags(e, s, CU_EVENT_RECORD_EXTERNAL);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/cnnc/cnnc/runtime/device"
)

// cu.Event holds only a CUevent; read it through unsafe (compile-time size
// check, as for cu.Stream in graph.go).
var _ = [1]struct{}{}[unsafe.Sizeof(cu.Event{})-unsafe.Sizeof(uintptr(0))]

func cEvent(e cu.Event) C.CUevent { return *(*C.CUevent)(unsafe.Pointer(&e)) }

var _ device.Fencer = (*Device)(nil)

// fence is a CUDA event on the device's stream.
type fence struct {
	d      *Device
	ev     cu.Event
	timing bool
}

// NewFence makes an event (device.Fencer); without timing it is made with
// CU_EVENT_DISABLE_TIMING, which makes waiting for it cheaper.
func (d *Device) NewFence(timing bool) (device.Fence, error) {
	f := &fence{d: d, timing: timing}
	flags := cu.DisableTiming
	if timing {
		flags = cu.DefaultEvent
	}
	err := d.do(func() error {
		var err error
		if f.ev, err = cu.MakeEvent(flags); err != nil {
			return fmt.Errorf("cuda: cuEventCreate: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Record records the event on the stream, or while a Capture records,
// into the graph.
func (f *fence) Record() error {
	return f.d.do(func() error {
		if f.d.capture != nil {
			if err := check(C.cnncRecordInCapture(cEvent(f.ev), cStream(f.d.stream))); err != nil {
				return fmt.Errorf("cuda: cuEventRecordWithFlags(EXTERNAL) in a capture: %w", err)
			}
			return nil
		}
		if err := f.ev.Record(f.d.stream); err != nil {
			return fmt.Errorf("cuda: cuEventRecord: %w", err)
		}
		return nil
	})
}

// Wait waits for the event: a fault of the work before it surfaces here,
// naming the last kernel launched as Sync does.
func (f *fence) Wait() error {
	return f.d.do(func() error {
		err := f.d.await(f.ev.Synchronize)
		if err == nil {
			return nil
		}
		if w, ok := err.(watchStop); ok {
			return w.err
		}
		if f.d.last != "" && !f.d.opts.Debug {
			return fmt.Errorf("cuda: cuEventSynchronize: %w (the last kernel launched was %s; faults surface at the next synchronisation: run with %s=1 to check every launch and name the kernel)", err, f.d.last, DebugEnv)
		}
		return fmt.Errorf("cuda: cuEventSynchronize: %w", err)
	})
}

// Since is the time between earlier's event and f's.
func (f *fence) Since(earlier device.Fence) (time.Duration, error) {
	e, ok := earlier.(*fence)
	if !ok || e.d != f.d || !f.timing || !e.timing {
		return 0, errors.New("cuda: Since needs two timing fences of the same device")
	}
	var ms float64
	err := f.d.do(func() error {
		var err error
		if ms, err = e.ev.Elapsed(f.ev); err != nil {
			return fmt.Errorf("cuda: cuEventElapsedTime: %w", err)
		}
		return nil
	})
	return time.Duration(ms * float64(time.Millisecond)), err
}

// Close destroys the event.
func (f *fence) Close() error {
	return f.d.do(func() error {
		if err := cu.DestroyEvent(&f.ev); err != nil {
			return fmt.Errorf("cuda: cuEventDestroy: %w", err)
		}
		return nil
	})
}
