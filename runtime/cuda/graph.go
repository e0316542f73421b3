//go:build cuda

package cuda

// CUDA graphs: a training step's launches captured once from the stream and
// replayed with one cuGraphLaunch, removing the per-kernel launch overhead
// that dominates small batches. gorgonia.org/cu cannot capture streams, so
// this goes through the driver API directly.
//
// A captured kernel node keeps the parameter values of its launch. The
// values that change from step to step (Adam's step number, dropout's
// seed and offset, a partial batch's sample count) are updated in the
// instantiated graph before a replay with cuGraphExecKernelNodeSetParams;
// the node of each launch is read right after it is captured
// (cuStreamGetCaptureInfo_v2: the node the next one would depend on).
// Capture, capture info, instantiation and node updates go through the
// entry points resolved in driver.go.

/*
#cgo LDFLAGS: -lcuda
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo linux CFLAGS: -I/usr/local/cuda/include -I/usr/include

#include <stdint.h>
#include <stdlib.h>

#include "driver.h"

static CUresult cnncBeginCapture(CUstream s) {
	return cnncStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
}

// cnncCapturedNode returns the node of the operation just captured on s:
// in a capture that is a chain, the one node the next would depend on.
static CUresult cnncCapturedNode(CUstream s, CUgraphNode *node) {
	CUstreamCaptureStatus status;
	cuuint64_t id;
	CUgraph g;
	const CUgraphNode *deps = NULL;
	size_t n = 0;
	CUresult r = cnncStreamGetCaptureInfo(s, &status, &id, &g, &deps, &n);
	if (r != CUDA_SUCCESS) return r;
	if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	if (n != 1 || !deps) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
	*node = deps[0];
	return CUDA_SUCCESS;
}

static CUresult cnncEndCapture(CUstream s, CUgraph *g) {
	return cuStreamEndCapture(s, g);
}

static CUresult cnncInstantiate(CUgraphExec *e, CUgraph g) {
	return cnncGraphInstantiate(e, g, 0);
}

// cnncSetKernelParams gives a kernel node of an instantiated graph new
// parameter values (n 8-byte values; the driver copies them).
static CUresult cnncSetKernelParams(CUgraphExec e, CUgraphNode node, CUfunction f,
		unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned shared, const uint64_t *vals, int n) {
	void **ptrs = malloc((n > 0 ? n : 1) * sizeof(void *));
	uint64_t *copy = malloc((n > 0 ? n : 1) * sizeof(uint64_t));
	if (!ptrs || !copy) {
		free(ptrs);
		free(copy);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	for (int i = 0; i < n; i++) {
		copy[i] = vals[i];
		ptrs[i] = &copy[i];
	}
	cnncKernelNodeParamsV1 p = {0};
	p.func = f;
	p.gridDimX = gx;
	p.gridDimY = gy;
	p.gridDimZ = gz;
	p.blockDimX = bx;
	p.blockDimY = by;
	p.blockDimZ = bz;
	p.sharedMemBytes = shared;
	p.kernelParams = ptrs;
	CUresult r = cnncGraphExecKernelNodeSetParams(e, node, &p);
	free(ptrs);
	free(copy);
	return r;
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

	"github.com/cnnc/cnnc/runtime/device"
)

// cu.Stream holds only a CUstream; read it through unsafe (compile-time
// size check, as for cu.Function in shim.go).
var _ = [1]struct{}{}[unsafe.Sizeof(cu.Stream{})-unsafe.Sizeof(uintptr(0))]

func cStream(s cu.Stream) C.CUstream { return *(*C.CUstream)(unsafe.Pointer(&s)) }

// Graph is an instantiated capture of launches.
type Graph struct {
	g     C.CUgraph
	e     C.CUgraphExec
	nodes []capturedLaunch // in the order of the captured launches
}

// capturedLaunch is a kernel node and the launch it was captured from.
type capturedLaunch struct {
	node        C.CUgraphNode
	kernel      string
	fn          cu.Function
	grid, block device.Dim3
	shared      int
	nparams     int
}

// Capture records the launches run makes (through Launch) into a graph
// instead of running them. run must not synchronise, copy, allocate or
// free; kernel arguments are captured by value (SetParams changes them).
func (d *Device) Capture(run func() error) (*Graph, error) {
	if d.opts.Debug {
		return nil, fmt.Errorf("cuda: graphs cannot be captured in debug mode (%s=1 synchronises after every launch)", DebugEnv)
	}
	gr := &Graph{}
	err := d.do(func() error {
		if err := check(C.cnncBeginCapture(cStream(d.stream))); err != nil {
			return fmt.Errorf("cuda: cuStreamBeginCapture: %w", err)
		}
		d.capture = gr
		return nil
	})
	if err != nil {
		return nil, err
	}
	runErr := run()
	err = d.do(func() error {
		d.capture = nil
		if err := check(C.cnncEndCapture(cStream(d.stream), &gr.g)); err != nil {
			if runErr != nil {
				return runErr
			}
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

// recordCaptured notes the node of the kernel just captured (on the
// worker, from launch).
func (d *Device) recordCaptured(kernel string, f *function, grid, block device.Dim3, shared, nparams int) error {
	var node C.CUgraphNode
	if err := check(C.cnncCapturedNode(cStream(d.stream), &node)); err != nil {
		return fmt.Errorf("cuStreamGetCaptureInfo_v2 after capturing the launch: %w", err)
	}
	d.capture.nodes = append(d.capture.nodes, capturedLaunch{node: node, kernel: kernel, fn: f.fn,
		grid: grid, block: block, shared: shared, nparams: nparams})
	return nil
}

// SetParams gives the i-th captured launch new parameter values for the
// graph's later replays.
func (d *Device) SetParams(gr *Graph, i int, params []uint64) error {
	return d.do(func() error {
		if i < 0 || i >= len(gr.nodes) {
			return fmt.Errorf("cuda: SetParams(%d): the graph has %d launches", i, len(gr.nodes))
		}
		n := gr.nodes[i]
		if len(params) != n.nparams {
			return &device.LaunchError{Kernel: n.kernel, Err: fmt.Errorf("graph node: %d parameters given, %d captured", len(params), n.nparams)}
		}
		var vals *C.uint64_t
		if len(params) > 0 {
			vals = (*C.uint64_t)(unsafe.Pointer(&params[0]))
		}
		err := check(C.cnncSetKernelParams(gr.e, n.node, cFunction(n.fn),
			C.uint(n.grid[0]), C.uint(n.grid[1]), C.uint(n.grid[2]),
			C.uint(n.block[0]), C.uint(n.block[1]), C.uint(n.block[2]),
			C.uint(n.shared), vals, C.int(len(params))))
		if err != nil {
			return &device.LaunchError{Kernel: n.kernel, Err: fmt.Errorf("cuGraphExecKernelNodeSetParams: %w", err)}
		}
		return nil
	})
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
		gr.g, gr.e, gr.nodes = nil, nil, nil
		if err != nil {
			return fmt.Errorf("cuda: destroying a graph: %w", err)
		}
		return nil
	})
}

// CaptureGraph implements device.Grapher.
func (d *Device) CaptureGraph(run func() error) (device.Replayer, error) {
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

func (r *replayer) Replay() error                          { return r.d.Replay(r.gr) }
func (r *replayer) SetParams(i int, params []uint64) error { return r.d.SetParams(r.gr, i, params) }
func (r *replayer) Close() error                           { return r.d.DestroyGraph(r.gr) }
