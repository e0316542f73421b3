package plan

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// analysis holds what the search needs to know about the input graph;
// candidates refer to its nodes by ID (clones keep IDs).
type analysis struct {
	g      *ir.Graph
	batch  int64
	align  int64
	budget int64 // 0: none
	// fusedFirst: UpdatesFusedFirst under a budget (better).
	fusedFirst bool
	// workspace sizes a step's kernel scratch (Config.Workspace), or nil.
	workspace func(n *ir.Node, samples int64) int64
	// dp: a rank's plan of data-parallel training (parallel.go); nil on
	// one device.
	dp *dpConfig

	fwd    []*ir.Node  // forward kernels in order (views excluded)
	fwdIdx map[int]int // forward node ID -> index in fwd
	// byKey maps a forward node's layer and position to its index in fwd:
	// backward and update nodes carry the layer and position of the
	// forward node they belong to (see ownerOf).
	byKey map[string]int
	// partner maps a fused weight-gradient node ID to the ID of its layer's
	// input-gradient node (absent when the layer has none).
	partner map[int]int
	// fusedUpdates are the weight-gradient nodes with an update fused in,
	// in graph order: the layers whose update may be split off.
	fusedUpdates []*ir.Node
	// gradsFirst maps a weight-gradient node without a fused update (an
	// unfused conv's, or any under gradient clipping) to its layer's
	// input-gradient node: the schedule runs it first, so the saved input
	// it reads may die before the input gradient is allocated.
	gradsFirst map[int]int
	// units are the indices in fwd of nodes an output of which the backward
	// pass reads: the activations recomputation may drop. saved[i] is the
	// bytes of those outputs of unit i at the batch.
	units []int
	saved map[int]int64
	// loss is the index in fwd of the node defining the loss.
	loss int
}

// isView: the node's output is its input's memory (ir.OpInfo.View).
func isView(n *ir.Node) bool { return n.Op.Info().View }

// root follows views (flatten, reshape) to the value that owns the memory.
func root(v *ir.Value) *ir.Value {
	for v.Def != nil && isView(v.Def) {
		v = v.Def.Ins[0]
	}
	return v
}

// hasFusedUpdate: a kernel (a weight gradient) with its parameters'
// optimizer update fused in, which the planner may split off.
func hasFusedUpdate(n *ir.Node) bool { return n.Attrs.Opt != nil && !n.Op.Info().Update }

func posKey(name string, p dsl.Pos) string { return fmt.Sprintf("%s@%d:%d", name, p.Line, p.Col) }

func analyze(g *ir.Graph, batch, align int64) (*analysis, error) {
	if err := g.Verify(); err != nil {
		return nil, fmt.Errorf("plan: the graph does not verify: %w", err)
	}
	if (g.Loss == nil || g.Loss.Def == nil) && !g.Infer {
		return nil, fmt.Errorf("plan: the graph has no loss")
	}
	a := &analysis{g: g, batch: batch, align: align, fwdIdx: map[int]int{}, byKey: map[string]int{}, partner: map[int]int{}, gradsFirst: map[int]int{}, saved: map[int]int64{}, loss: -1}
	byKey := a.byKey
	for _, n := range g.Nodes {
		if n.Phase != ir.Forward || isView(n) {
			continue
		}
		a.fwdIdx[n.ID] = len(a.fwd)
		if _, dup := byKey[posKey(n.Name, n.Pos)]; !dup {
			byKey[posKey(n.Name, n.Pos)] = len(a.fwd)
		}
		if g.Loss != nil && n == g.Loss.Def {
			a.loss = len(a.fwd)
		}
		a.fwd = append(a.fwd, n)
	}
	readInBackward := map[*ir.Value]bool{}
	gradInput := map[int]int{} // forward index -> grad_input node ID
	for _, n := range g.Nodes {
		if n.Phase == ir.Forward || isView(n) {
			continue
		}
		own := a.ownerOf(n)
		for _, v := range n.Ins {
			readInBackward[root(v)] = true
		}
		if n.Op.Info().GradInput && own >= 0 {
			gradInput[own] = n.ID
		}
	}
	for _, n := range g.Nodes {
		if gi, ok := gradInput[a.ownerOf(n)]; ok && n.Phase == ir.Backward && writesOnlyParamGrads(n) {
			a.gradsFirst[n.ID] = gi
		}
		if hasFusedUpdate(n) {
			a.fusedUpdates = append(a.fusedUpdates, n)
			if gi, ok := gradInput[a.ownerOf(n)]; ok {
				a.partner[n.ID] = gi
			}
		}
	}
	for i, n := range a.fwd {
		if i == a.loss {
			continue
		}
		for _, o := range n.Outs {
			if readInBackward[o] {
				a.saved[i] += o.Type.Bytes(batch)
			}
		}
		if a.saved[i] > 0 {
			a.units = append(a.units, i)
		}
	}
	return a, nil
}

// writesOnlyParamGrads: n is a weight gradient writing gradient buffers.
func writesOnlyParamGrads(n *ir.Node) bool {
	for _, o := range n.Outs {
		if o.Role != ir.RoleGrad {
			return false
		}
	}
	return len(n.Outs) > 0 && n.Attrs.Opt == nil
}

// ownerOf returns the index in fwd of the forward node a node belongs to:
// itself for a forward kernel; for backward and update nodes the forward
// node of the same layer and position (gradient rules and update nodes
// take those from the node they differentiate or update); -1 if none.
func (a *analysis) ownerOf(n *ir.Node) int {
	if i, ok := a.fwdIdx[n.ID]; ok {
		return i
	}
	if i, ok := a.byKey[posKey(n.Name, n.Pos)]; ok {
		return i
	}
	return -1
}

// coupledError: a micro-batch loop would hold a batch-coupled node.
type coupledError struct{ n *ir.Node }

func (e *coupledError) Error() string {
	return fmt.Sprintf("%s (%s) reads the whole batch and cannot run in a micro-batch loop", e.n.Name, e.n.Op)
}

// firstCoupled is the first forward node whose output depends on other
// samples of the batch (batch norm's statistics), or nil.
func (a *analysis) firstCoupled() *ir.Node {
	for _, n := range a.fwd {
		if n.Op.Info().BatchCoupled {
			return n
		}
	}
	return nil
}

// layerName names a forward node for reports: its layer, or its output.
func layerName(n *ir.Node) string {
	if n.Name != "" {
		return n.Name
	}
	return n.Out().Name
}
