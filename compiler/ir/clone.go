package ir

// Clone returns a deep copy of g: new Values, Params and Nodes with the
// same IDs, names, types and positions, so that a planner can rewrite the
// copy (split an update out of a kernel, reorder nodes) and still compare
// it with g by ID. Attribute slices and the optimizer settings are shared:
// nothing rewrites them in place.
func (g *Graph) Clone() *Graph {
	c := &Graph{Name: g.Name, Opt: g.Opt, ClipGradNorm: g.ClipGradNorm, Infer: g.Infer, Eval: g.Eval, nextValue: g.nextValue, nextNode: g.nextNode, names: map[string]bool{}}
	for k, v := range g.names {
		c.names[k] = v
	}
	values := map[*Value]*Value{}
	params := map[*Param]*Param{}
	var value func(v *Value) *Value
	var param func(p *Param) *Param
	value = func(v *Value) *Value {
		if v == nil {
			return nil
		}
		if cv, ok := values[v]; ok {
			return cv
		}
		cv := *v
		values[v] = &cv
		cv.Def = nil // set when its node is copied
		cv.Param = param(v.Param)
		return &cv
	}
	param = func(p *Param) *Param {
		if p == nil {
			return nil
		}
		if cp, ok := params[p]; ok {
			return cp
		}
		cp := *p
		params[p] = &cp
		cp.Value = value(p.Value)
		cp.State = make([]*Value, len(p.State))
		for i, s := range p.State {
			cp.State[i] = value(s)
		}
		return &cp
	}
	for _, v := range g.Inputs {
		c.Inputs = append(c.Inputs, value(v))
	}
	for _, p := range g.Params {
		c.Params = append(c.Params, param(p))
	}
	for _, p := range g.Buffers {
		c.Buffers = append(c.Buffers, param(p))
	}
	for _, v := range g.State {
		c.State = append(c.State, value(v))
	}
	for _, n := range g.Nodes {
		cn := *n
		cn.Ins = make([]*Value, len(n.Ins))
		for i, v := range n.Ins {
			cn.Ins[i] = value(v)
		}
		cn.Outs = make([]*Value, len(n.Outs))
		for i, v := range n.Outs {
			cn.Outs[i] = value(v)
			cn.Outs[i].Def = &cn
		}
		c.Nodes = append(c.Nodes, &cn)
	}
	c.Loss = value(g.Loss)
	c.Logits = value(g.Logits)
	return c
}
