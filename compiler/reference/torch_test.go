package reference

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// requireTorch returns Debian's python3 when it has PyTorch; without it the
// test is skipped loudly, or fails with CNNC_REQUIRE_TORCH=1 (CI).
func requireTorch(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		if os.Getenv("CNNC_REQUIRE_TORCH") == "1" {
			t.Fatalf("CNNC_REQUIRE_TORCH=1 but %s cannot import torch: %v (apt-get install python3-torch)", py, err)
		}
		t.Skipf("!!! SKIPPING %s: %s cannot import torch (apt-get install python3-torch)", t.Name(), py)
	}
	return py
}

type torchTensor struct {
	Shape []int64   `json:"shape"`
	Data  []float64 `json:"data"`
}

type torchCase struct {
	Expr    string                 `json:"expr"`
	Tensors map[string]torchTensor `json:"tensors"`
	Grad    []string               `json:"grad"`
	DY      torchTensor            `json:"dy"`
}

type torchResult struct {
	Out   []float64            `json:"out"`
	Grads map[string][]float64 `json:"grads"`
	After map[string][]float64 `json:"after"`
}

// opRun is the reference's side of one case: the op's output, the
// gradients of its inputs (by the names the case gives them) and the
// buffers after the call.
type opRun struct {
	name  string
	out   []float64
	grads map[string][]float64
	after map[string][]float64
}

// Every example of every op that names its PyTorch expression
// (DSL.Torch): the op's forward nodes in the float64 reference (training
// mode: batch statistics, running statistics updated) and its backward
// nodes for a random output gradient, against PyTorch's forward and
// autograd in float64 on the same random inputs, parameters and buffers.
// Both compute in float64, so they differ by rounding in different
// summation orders only: at most about n·2^-53 relative to the values'
// scale for reductions of n terms (n < 1000 here), far below 1e-9.
func TestOpsAgainstPyTorch(t *testing.T) {
	py := requireTorch(t)
	var cases []torchCase
	var runs []opRun
	for _, d := range ops.DSLOps() {
		for i, expr := range d.DSL.Torch {
			call := d.DSL.Examples[i]
			g := compileWith(t, ops.ExampleModel(d, call), "fuse")
			c, r := torchOpCase(t, g, d, call, expr, uint64(len(cases))+1)
			cases = append(cases, c)
			runs = append(runs, r)
		}
	}
	in, err := json.Marshal(cases)
	require.NoError(t, err)
	cmd := exec.Command(py, "../../scripts/torch_ops.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	var results []torchResult
	require.NoError(t, json.Unmarshal(out, &results))
	require.Len(t, results, len(runs))
	for i, r := range runs {
		res := results[i]
		t.Run(r.name, func(t *testing.T) {
			closeTo(t, "output", res.Out, r.out)
			for name, want := range r.grads {
				closeTo(t, "gradient of "+name, res.Grads[name], want)
			}
			for name, want := range r.after {
				closeTo(t, name+" after the call", res.After[name], want)
			}
		})
	}
}

// closeTo compares PyTorch's values with the reference's, relative to the
// values' largest magnitude (see TestOpsAgainstPyTorch for the bound).
func closeTo(t *testing.T, what string, torch, ref []float64) {
	t.Helper()
	require.Len(t, torch, len(ref), what)
	scale := 1e-300
	for _, v := range torch {
		scale = math.Max(scale, math.Abs(v))
	}
	worst := 0.0
	for i := range ref {
		worst = math.Max(worst, math.Abs(torch[i]-ref[i])/scale)
	}
	assert.LessOrEqual(t, worst, 1e-9, "%s: worst relative difference", what)
}

// torchOpCase runs the nodes of the example's layer on random values.
func torchOpCase(t *testing.T, g *ir.Graph, d *ops.Def, call, expr string, seed uint64) (torchCase, opRun) {
	const batch = 3
	rng := rand.New(rand.NewPCG(seed, 99))
	var fwd, bwd []*ir.Node
	for _, n := range g.Nodes {
		if n.Name != ops.ExampleLayer {
			continue
		}
		switch n.Phase {
		case ir.Forward:
			fwd = append(fwd, n)
		case ir.Backward:
			bwd = append(bwd, n)
		}
	}
	require.NotEmpty(t, fwd, call)
	c := torchCase{Expr: expr, Tensors: map[string]torchTensor{}}
	r := opRun{name: call, grads: map[string][]float64{}, after: map[string][]float64{}}
	vals := map[*ir.Value][]float64{}
	names := map[*ir.Value]string{} // the case's names of the layer's inputs
	defined := map[*ir.Value]bool{}
	scale := max(d.DSL.TestScale, 1)
	for _, n := range fwd {
		for _, v := range n.Ins {
			if defined[v] || vals[v] != nil {
				continue
			}
			data := make([]float64, v.Type.Elems(batch))
			name := v.Name
			switch v.Role {
			case ir.RoleParam, ir.RoleBuffer:
				name = strings.TrimPrefix(v.Param.Name, v.Param.Layer+".")
				for i := range data {
					data[i] = 2*rng.Float64() - 1
					if v.Param.Init.Kind == ir.InitOnes {
						data[i] = 1 + data[i]/2 // running variance, scale: positive
					}
				}
			default:
				for i := range data {
					data[i] = (2*rng.Float64() - 1) * scale
				}
				c.Grad = append(c.Grad, name)
			}
			if v.Role == ir.RoleParam {
				c.Grad = append(c.Grad, name)
			}
			if v.Type.DType == ir.I64 {
				// a counter (num_batches_tracked): PyTorch's functional
				// batch norm has none
				data[0] = 0
				vals[v] = data
				continue
			}
			vals[v], names[v] = data, name
			c.Tensors[name] = torchTensor{Shape: shapeAt(v.Type, batch), Data: append([]float64(nil), data...)}
		}
		outs, err := RunNode(n, inputs(n, vals), batch, NodeOptions{Training: true, Update: true, Seed: 5})
		require.NoError(t, err, n.Text())
		for i, v := range n.Outs {
			vals[v], defined[v] = outs[i], true
		}
	}
	o := fwd[len(fwd)-1].Out()
	r.out = vals[o]
	for v, name := range names {
		if v.Role == ir.RoleBuffer {
			r.after[name] = vals[v] // written in place by the forward nodes
		}
	}
	c.DY = torchTensor{Shape: shapeAt(o.Type, batch), Data: make([]float64, len(r.out))}
	for i := range c.DY.Data {
		c.DY.Data[i] = 2*rng.Float64() - 1
	}
	// the backward nodes read dy: the one value neither the layer's forward
	// nor backward nodes define
	for _, n := range bwd {
		for _, v := range n.Ins {
			if vals[v] == nil {
				vals[v] = c.DY.Data
			}
		}
		outs, err := RunNode(n, inputs(n, vals), batch, NodeOptions{Training: true, Seed: 5})
		require.NoError(t, err, n.Text())
		for i, v := range n.Outs {
			vals[v] = outs[i]
			if v.Param != nil && v.Role == ir.RoleGrad {
				r.grads[names[v.Param.Value]] = outs[i]
			}
			// an input the op reads twice (concat(x, x)) gets a gradient
			// from each read, which the engine sums at its producer
			for in, name := range names {
				if v.Role == ir.RoleActGrad && (v.Name == in.Name+".grad" || strings.HasPrefix(v.Name, in.Name+".grad.")) {
					r.grads[name] = addTo(r.grads[name], outs[i])
				}
			}
		}
	}
	return c, r
}

// addTo returns sum + x elementwise (x when sum is nil).
func addTo(sum, x []float64) []float64 {
	if sum == nil {
		return append([]float64(nil), x...)
	}
	for i := range sum {
		sum[i] += x[i]
	}
	return sum
}

func inputs(n *ir.Node, vals map[*ir.Value][]float64) [][]float64 {
	ins := make([][]float64, len(n.Ins))
	for i, v := range n.Ins {
		ins[i] = vals[v]
	}
	return ins
}

func shapeAt(t ir.Type, batch int64) []int64 {
	if t.Batched {
		return append([]int64{batch}, t.Dims...)
	}
	return append([]int64{}, t.Dims...)
}

// Batch norm's running statistics after several training calls (each
// with its own batch, momentum 0.3, the unbiased variance) equal
// PyTorch's, maps and features alike, and so does the last call's
// normalisation.
func TestBatchNormRunningStatisticsAgainstPyTorch(t *testing.T) {
	py := requireTorch(t)
	const batch, calls = 4, 3
	var cases []torchCase
	type want struct {
		name    string
		y       []float64
		mean, v []float64
	}
	var wants []want
	for _, name := range []string{"batchnorm2d", "batchnorm1d"} {
		d := ops.ByDSLName(name)
		call := name + "(x, momentum=0.3, affine=false)"
		g := compileWith(t, ops.ExampleModel(d, call), "fuse")
		var stats, apply *ir.Node
		for _, n := range g.Nodes {
			switch n.Op {
			case ops.BatchNormStats:
				stats = n
			case d.Op:
				apply = n
			}
		}
		require.NotNil(t, stats)
		rng := rand.New(rand.NewPCG(21, uint64(len(cases))))
		x := stats.Ins[0].Type
		c := torchCase{Expr: "(", Tensors: map[string]torchTensor{}, Grad: []string{}}
		rm := InitParam(stats.Ins[1].Param, 0)
		rv := InitParam(stats.Ins[2].Param, 0)
		nbt := []float64{0}
		var y []float64
		for k := 0; k < calls; k++ {
			data := make([]float64, x.Elems(batch))
			for i := range data {
				data[i] = 3*rng.Float64() - 1 // mean 1/2: the running mean moves
			}
			xn := fmt.Sprintf("x%d", k)
			c.Tensors[xn] = torchTensor{Shape: shapeAt(x, batch), Data: data}
			c.Expr += fmt.Sprintf("F.batch_norm(%s, running_mean, running_var, training=True, momentum=0.3), ", xn)
			st, err := RunNode(stats, [][]float64{data, rm, rv, nbt}, batch, NodeOptions{Training: true, Update: true})
			require.NoError(t, err)
			out, err := RunNode(apply, [][]float64{data, st[0], st[1]}, batch, NodeOptions{Training: true})
			require.NoError(t, err)
			y = out[0]
		}
		c.Expr += ")[-1]"
		require.Equal(t, float64(calls), nbt[0], "one count per training call")
		c.Tensors["running_mean"] = torchTensor{Shape: []int64{x.Dims[0]}, Data: InitParam(stats.Ins[1].Param, 0)}
		c.Tensors["running_var"] = torchTensor{Shape: []int64{x.Dims[0]}, Data: InitParam(stats.Ins[2].Param, 0)}
		cases = append(cases, c)
		wants = append(wants, want{name: name, y: y, mean: rm, v: rv})
	}
	in, err := json.Marshal(cases)
	require.NoError(t, err)
	cmd := exec.Command(py, "../../scripts/torch_ops.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	var results []torchResult
	require.NoError(t, json.Unmarshal(out, &results))
	for i, w := range wants {
		closeTo(t, w.name+" output", results[i].Out, w.y)
		closeTo(t, w.name+" running_mean", results[i].After["running_mean"], w.mean)
		closeTo(t, w.name+" running_var", results[i].After["running_var"], w.v)
	}
}
