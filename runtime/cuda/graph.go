//go:build cuda

package cuda

// CUDA graphs: a training step's launches captured once from the stream and
// replayed with one cuGraphLaunch, removing the per-kernel launch overhead
// that dominates small batches. gorgonia.org/cu cannot capture streams, so
// this goes through the driver API directly.

/*
#cgo LDFLAGS: -lcuda
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo linux CFLAGS: -I/usr/local/cuda/include -I/usr/include

#include <cuda.h>

static CUresult cnncBeginCapture(CUstream s) {
	return cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
}

static CUresult cnncEndCapture(CUstream s, CUgraph *g) {
	return cuStreamEndCapture(s, g);
}

static CUresult cnncInstantiate(CUgraphExec *e, CUgraph g) {
	return cuGraphInstantiateWithFlags(e, g, 0);
}

static CUresult cnncGraphLaunch(CUgraphExec e, CUstream s) {
	return cuGraphLaunch(e, s);
}

static CUresult cnncGraphDestroy(CUgraph g, CUgraphExec e) {
	CUresult r = CUDA_SUCCESS;
	if (e) r = cuGraphExecDestroy(e);
	if (g) {
		CUresult r2 = cuGraphDestroy(g);
		if (r == CUDA_SUCCESS) r = r2;
	}
	return r;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/cnnc/cnnc/runtime"
)

// cu.Stream holds only a CUstream; read it through unsafe (compile-time
// size check, as for cu.Function in shim.go).
var _ = [1]struct{}{}[unsafe.Sizeof(cu.Stream{})-unsafe.Sizeof(uintptr(0))]

func cStream(s cu.Stream) C.CUstream { return *(*C.CUstream)(unsafe.Pointer(&s)) }

// Graph is an instantiated capture of launches.
type Graph struct {
	g C.CUgraph
	e C.CUgraphExec
}

// Capture records the launches run makes (through Launch) into a graph
// instead of running them. run must not synchronise or copy; kernel
// arguments are captured by value, so a graph stays valid only while they
// do not change.
func (d *Device) Capture(run func() error) (*Graph, error) {
	if d.opts.Debug {
		return nil, fmt.Errorf("cuda: graphs cannot be captured in debug mode (%s=1 synchronises after every launch)", DebugEnv)
	}
	err := d.do(func() error {
		if err := check(C.cnncBeginCapture(cStream(d.stream))); err != nil {
			return fmt.Errorf("cuda: cuStreamBeginCapture: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	runErr := run()
	gr := &Graph{}
	err = d.do(func() error {
		if err := check(C.cnncEndCapture(cStream(d.stream), &gr.g)); err != nil {
			return fmt.Errorf("cuda: cuStreamEndCapture: %w", err)
		}
		if runErr != nil {
			return runErr
		}
		if err := check(C.cnncInstantiate(&gr.e, gr.g)); err != nil {
			return fmt.Errorf("cuda: cuGraphInstantiate: %w", err)
		}
		return nil
	})
	if err != nil {
		d.DestroyGraph(gr)
		return nil, err
	}
	return gr, nil
}

// Replay queues the whole graph on the stream.
func (d *Device) Replay(gr *Graph) error {
	return d.do(func() error {
		if err := check(C.cnncGraphLaunch(gr.e, cStream(d.stream))); err != nil {
			return fmt.Errorf("cuda: cuGraphLaunch: %w", err)
		}
		d.last = "the training step's CUDA graph"
		return nil
	})
}

// DestroyGraph frees a graph.
func (d *Device) DestroyGraph(gr *Graph) error {
	if gr == nil {
		return nil
	}
	return d.do(func() error {
		err := check(C.cnncGraphDestroy(gr.g, gr.e))
		gr.g, gr.e = nil, nil
		return err
	})
}

// CaptureGraph implements runtime.Grapher.
func (d *Device) CaptureGraph(run func() error) (runtime.Replayer, error) {
	gr, err := d.Capture(run)
	if err != nil {
		return nil, err
	}
	return &replayer{d: d, gr: gr}, nil
}

type replayer struct {
	d  *Device
	gr *Graph
}

func (r *replayer) Replay() error { return r.d.Replay(r.gr) }
func (r *replayer) Close() error  { return r.d.DestroyGraph(r.gr) }
