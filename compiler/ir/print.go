package ir

import (
	"fmt"
	"strings"
)

// Text prints the graph in its one deterministic text form:
//
//	graph NAME
//	input %image: f32[B,3,128,128]  @4:21
//	param %conv1.weight: f32[16,3,3,3] init=kaiming_uniform(a=sqrt5,fan_in=27)  @5:13
//	state %conv1.weight.momentum_buffer: f32[16,3,3,3]
//	forward:
//	  %conv1 = conv2d(%image, %conv1.weight, %conv1.bias) out=16 kernel=3x3 stride=1x1 pad=0x0 : f32[B,16,126,126]  @5:13
//	backward:
//	  ...
//	update:
//	  sgd_update(%conv1.weight, %conv1.weight.grad, ...) opt=sgd(...)
//	loss %loss
//
// Positions are printed as line:col only, so the text does not depend on
// where the file lives.
func (g *Graph) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "graph %s\n", g.Name)
	for _, v := range g.Inputs {
		fmt.Fprintf(&b, "input %s: %s%s\n", v, v.Type, posSuffix(v.Pos.Line, v.Pos.Col))
	}
	for _, p := range g.Params {
		v := p.Value
		if p.Fold != nil {
			fmt.Fprintf(&b, "param %s: %s fold=%s%s\n", v, v.Type, p.Fold, posSuffix(v.Pos.Line, v.Pos.Col))
			continue
		}
		fmt.Fprintf(&b, "param %s: %s init=%s%s\n", v, v.Type, p.Init, posSuffix(v.Pos.Line, v.Pos.Col))
	}
	for _, p := range g.Buffers {
		v := p.Value
		fmt.Fprintf(&b, "buffer %s: %s init=%s%s\n", v, v.Type, p.Init, posSuffix(v.Pos.Line, v.Pos.Col))
	}
	for _, v := range g.State {
		fmt.Fprintf(&b, "state %s: %s\n", v, v.Type)
	}
	phase := Phase(255)
	for _, n := range g.Nodes {
		if n.Phase != phase {
			phase = n.Phase
			fmt.Fprintf(&b, "%s:\n", phase)
		}
		b.WriteString("  ")
		b.WriteString(n.Text())
		b.WriteByte('\n')
	}
	if g.Loss != nil {
		fmt.Fprintf(&b, "loss %s\n", g.Loss)
	}
	if g.Infer && g.Logits != nil {
		fmt.Fprintf(&b, "logits %s\n", g.Logits)
	}
	return b.String()
}

// Text prints one node on one line.
func (n *Node) Text() string {
	var b strings.Builder
	if len(n.Outs) > 0 {
		for i, v := range n.Outs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(v.String())
		}
		b.WriteString(" = ")
	}
	b.WriteString(n.Op.String())
	b.WriteByte('(')
	for i, v := range n.Ins {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.String())
	}
	b.WriteByte(')')
	for _, a := range n.Op.Info().Attrs {
		if a.Default != nil && a.Default(&n.Attrs) {
			continue
		}
		b.WriteByte(' ')
		b.WriteString(a.Name)
		b.WriteByte('=')
		b.WriteString(a.Text(&n.Attrs))
	}
	if len(n.Outs) > 0 {
		b.WriteString(" : ")
		for i, v := range n.Outs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(v.Type.String())
		}
	}
	b.WriteString(posSuffix(n.Pos.Line, n.Pos.Col))
	return b.String()
}

func posSuffix(line, col int) string {
	if line == 0 {
		return ""
	}
	return fmt.Sprintf("  @%d:%d", line, col)
}
