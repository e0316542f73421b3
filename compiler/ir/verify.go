package ir

import (
	"errors"
	"fmt"
)

// Verify checks the graph's invariants; passes must leave them true. It
// returns every violation found, joined.
//
//   - values have unique IDs and names and are defined exactly once, by a
//     graph input, parameter, optimizer state or one node output, before use;
//   - every node's output types equal what its op's type rule infers;
//   - phases run forward, then backward, then update;
//   - the loss is a scalar f32 computed in the forward phase;
//   - updates (update ops, or weight-gradient blocks with the update fused)
//     touch parameters only; once any exist every parameter is updated
//     exactly once, and no node reads a parameter after its update;
//   - ops write in place only buffers (besides updates); every op and
//     optimizer has a table row;
//   - a parameter's gradient has the parameter's type;
//   - an inference graph has forward nodes only, no loss, labels or
//     optimizer state, and its logits are computed; an evaluation graph
//     has forward nodes only.
func (g *Graph) Verify() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	defined := map[*Value]bool{}
	ids := map[int]*Value{}
	names := map[string]*Value{}
	define := func(v *Value, where string) {
		if defined[v] {
			bad("%s defined twice (%s)", v, where)
		}
		defined[v] = true
		if o, ok := ids[v.ID]; ok && o != v {
			bad("%s and %s share value id %d", v, o, v.ID)
		}
		ids[v.ID] = v
		if o, ok := names[v.Name]; ok && o != v {
			bad("two values are named %s", v)
		}
		names[v.Name] = v
		if !v.Type.IsKnown() {
			bad("%s has no type", v)
		}
	}
	for _, v := range g.Inputs {
		if v.Def != nil {
			bad("input %s has a defining node", v)
		}
		define(v, "input")
	}
	for _, p := range g.Params {
		if p.Value.Role != RoleParam || p.Value.Param != p {
			bad("param %s is not marked as a parameter", p.Value)
		}
		define(p.Value, "param")
	}
	for _, p := range g.Buffers {
		if p.Value.Role != RoleBuffer || p.Value.Param != p {
			bad("buffer %s is not marked as a buffer", p.Value)
		}
		define(p.Value, "buffer")
	}
	for _, v := range g.State {
		if v.Role != RoleOptState || v.Param == nil {
			bad("state %s does not belong to a parameter", v)
		}
		define(v, "state")
	}

	updates := map[*Param]int{}
	updated := map[*Value]*Node{}
	phase := Forward
	nodeIDs := map[int]bool{}
	for _, n := range g.Nodes {
		if nodeIDs[n.ID] {
			bad("node id %d used twice", n.ID)
		}
		if !n.Op.Defined() {
			bad("node %d has an op with no table row (%s)", n.ID, n.Op)
			continue
		}
		if o := n.Attrs.Opt; o != nil {
			if _, err := o.Info(); err != nil {
				bad("%s: %v", n.Text(), err)
			}
		}
		nodeIDs[n.ID] = true
		if n.Phase < phase {
			bad("%s (%s) comes after the %s phase", n.Text(), n.Phase, phase)
		}
		phase = n.Phase
		ups := n.UpdatedParams()
		for _, v := range n.Ins {
			if !defined[v] {
				bad("%s reads %s before it is defined", n.Op, v)
			}
			if u := updated[v]; u != nil {
				bad("%s reads %s after %s updated it", n.Op, v, u.Op)
			}
		}
		for _, p := range ups {
			updates[p]++
			updated[p.Value] = n
		}
		if n.Phase != Update {
			for _, v := range n.Ins {
				if v.Role == RoleParam && v.Param == nil {
					bad("%s reads parameter %s with no Param", n.Op, v)
				}
			}
		}
		want, err := n.Op.Info().Infer(n)
		if err != nil {
			bad("%s: %v", n.Text(), err)
		} else if len(want) != len(n.Outs) {
			bad("%s: op gives %d outputs, node has %d", n.Text(), len(want), len(n.Outs))
		} else {
			for i, t := range want {
				if !t.Equal(n.Outs[i].Type) {
					bad("%s: output %s is %s but %s infers %s", n.Text(), n.Outs[i], n.Outs[i].Type, n.Op, t)
				}
			}
		}
		for _, v := range n.Outs {
			if v.Def != n {
				bad("%s: output %s points at another defining node", n.Op, v)
			}
			if v.Role == RoleParam || v.Role == RoleOptState || v.Role == RoleBuffer {
				bad("%s: node output %s has role %s", n.Op, v, v.Role)
			}
			define(v, n.Op.String())
			if v.Role == RoleGrad {
				if v.Param == nil {
					bad("gradient %s does not name its parameter", v)
				} else if !v.Type.Equal(v.Param.Value.Type) {
					bad("gradient %s is %s but %s is %s", v, v.Type, v.Param.Value, v.Param.Value.Type)
				}
			}
		}
		for _, i := range n.MutatedInputs() {
			if i >= len(n.Ins) || n.Ins[i].Role != RoleBuffer {
				bad("%s writes input %d in place, which is not a buffer", n.Op, i)
			}
		}
		if n.Phase == Update && !n.Op.Info().Update && !n.Op.Info().UpdateInput {
			bad("%s in the update phase", n.Op)
		}
	}
	if g.Infer {
		verifyInference(g, defined, bad)
	} else if g.Loss == nil {
		bad("graph has no loss")
	} else {
		if !g.Loss.Type.Equal(F32Fixed()) {
			bad("loss %s is %s, want f32[]", g.Loss, g.Loss.Type)
		}
		if g.Loss.Def == nil || g.Loss.Def.Phase != Forward || !defined[g.Loss] {
			bad("loss %s is not computed in the forward phase", g.Loss)
		}
	}
	if g.Eval {
		for _, n := range g.Nodes {
			if n.Phase != Forward {
				bad("evaluation graph has a %s node: %s", n.Phase, n.Text())
			}
		}
	}
	if len(updates) > 0 {
		for _, p := range g.Params {
			if updates[p] != 1 {
				bad("parameter %s is updated %d times", p.Value, updates[p])
			}
		}
	}
	return errors.Join(errs...)
}

// verifyInference checks what an inference graph (Graph.Infer) must be.
func verifyInference(g *Graph, defined map[*Value]bool, bad func(string, ...any)) {
	if g.Loss != nil {
		bad("inference graph has a loss (%s)", g.Loss)
	}
	if g.Logits == nil || !defined[g.Logits] || g.Logits.Def == nil {
		bad("inference graph computes no logits")
	}
	if len(g.State) > 0 {
		bad("inference graph has optimizer state")
	}
	for _, v := range g.Inputs {
		if v.Role == RoleLabel {
			bad("inference graph reads labels (%s)", v)
		}
	}
	for _, n := range g.Nodes {
		if n.Phase != Forward {
			bad("inference graph has a %s node: %s", n.Phase, n.Text())
		}
	}
}
