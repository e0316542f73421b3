package compiler

import (
	"fmt"
	"io"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/units"
)

// SummaryRow is one forward layer of the model summary.
type SummaryRow struct {
	Layer  string
	Op     string
	Output string // shape at the batch size, e.g. [32,16,126,126]
	Params int64
	FLOPs  int64 // forward FLOPs for the whole batch
	Pos    dsl.Pos
}

// Summary is the torchinfo-like table `cnnc check` prints.
type Summary struct {
	Model         string
	Batch         int64
	Rows          []SummaryRow
	Params        int64
	ParamBytes    int64
	ForwardFLOPs  int64 // per step
	TrainFLOPs    int64 // forward + backward + update, per step
	Inference     bool  // summarised for inference (compiler.Options.Infer): no training step
	InputBytes    int64 // one batch of inputs as f32
	ActivationsFP int64 // bytes of every forward activation at the batch size
}

// Summarize builds the summary of a compiled graph at the given batch size.
func Summarize(g *ir.Graph, batch int64) *Summary {
	s := &Summary{Model: g.Name, Batch: batch}
	for _, n := range g.Nodes {
		if n.Phase == ir.Forward {
			var params int64
			for _, v := range n.Ins {
				if v.Role == ir.RoleParam {
					params += v.Type.SampleElems()
				}
			}
			out := n.Out().Type
			shape := out.ShapeStringAt(batch)
			s.Rows = append(s.Rows, SummaryRow{Layer: n.Out().Name, Op: n.Op.String(), Output: shape, Params: params, FLOPs: n.FLOPs(batch), Pos: n.Pos})
			s.ForwardFLOPs = ir.AddSat(s.ForwardFLOPs, n.FLOPs(batch))
			s.ActivationsFP = ir.AddSat(s.ActivationsFP, out.Bytes(batch))
		}
		s.TrainFLOPs = ir.AddSat(s.TrainFLOPs, n.FLOPs(batch))
	}
	s.Params = g.ParamCount()
	s.ParamBytes = 4 * s.Params
	for _, v := range g.Inputs {
		if v.Role == ir.RoleInput {
			s.InputBytes += v.Type.Bytes(batch)
		}
	}
	return s
}

// Print writes the table.
func (s *Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "model %s, batch %d\n\n", s.Model, s.Batch)
	rows := [][]string{{"layer", "op", "output shape", "params", "FLOPs", "line"}}
	for _, r := range s.Rows {
		rows = append(rows, []string{r.Layer, r.Op, r.Output, Commas(r.Params), humanFLOPs(r.FLOPs), fmt.Sprint(r.Pos.Line)})
	}
	PrintTable(w, rows, []bool{false, false, false, true, true, true}, "")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "total params:        %s (%s as f32)\n", Commas(s.Params), units.FormatBytes(s.ParamBytes))
	fmt.Fprintf(w, "forward FLOPs:       %s per step\n", humanFLOPs(s.ForwardFLOPs))
	if !s.Inference {
		fmt.Fprintf(w, "training FLOPs:      %s per step (forward, backward, update)\n", humanFLOPs(s.TrainFLOPs))
	}
	fmt.Fprintf(w, "input batch:         %s as f32\n", units.FormatBytes(s.InputBytes))
	fmt.Fprintf(w, "forward activations: %s if every forward output were kept\n", units.FormatBytes(s.ActivationsFP))
}

func humanFLOPs(f int64) string { return humanCount(f) }

// PrintTable prints rows as aligned columns, each line after indent;
// right[i] right-aligns column i.
func PrintTable(w io.Writer, rows [][]string, right []bool, indent string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		b.WriteString(indent)
		for i, c := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-len(c))
			if right[i] {
				b.WriteString(pad + c)
			} else {
				b.WriteString(c + pad)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
