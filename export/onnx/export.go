// Package onnx exports a cnnc model with trained parameters as a standard
// ONNX model, for inference outside cnnc (ONNX Runtime, TensorRT, ...).
//
// In:  the forward IR — compiler.Compile stopped after the shapes (and dce)
// pass, before fuse — and the trained parameters (Weights, e.g. from a
// checkpoint); optionally the data block's deterministic preprocessing
// (Options.Preprocess).
// Out: an ONNX ModelProto (opset 13, IR version 7): input "image", float32
// [batch,C,H,W] in [0,1] exactly as torchvision's ToTensor gives it, with a
// dynamic batch dimension; output "logits", float32 [batch,classes]; one
// initializer per parameter under its PyTorch state_dict name (conv1.weight)
// holding the checkpoint's float32 bytes unchanged.
//
// Why it is shaped so: the forward IR is the model as the user wrote it,
// with every shape known and every node positioned, so the export is one
// mapping per op (its Def.ONNX in compiler/ops) onto the ONNX operator with the
// same evaluation-mode semantics — not a reverse-engineering of fused
// kernels. Only the nodes the logits depend on are exported: the loss is
// training's business, and its labels are not an input of the exported
// model. The encoder is a small hand-written protobuf writer for the few
// messages ONNX needs (proto.go), so cnnc gains no dependency and generates
// nothing at run time.
//
// The image the graph takes is what reaches the first layer in training:
// the trainer's loader delivers uint8 HWC pixels and the first conv's loads
// (or the to_tensor kernel) compute CHW pixel*(1/255) — torchvision's
// ToTensor, which the ONNX input already is, so today nothing is emitted
// for it. (ToTensor divides by 255 where the kernels multiply by the
// float32 reciprocal; the two differ by at most one ulp of a value in
// [0,1], 6e-8, far inside any comparison of logits.) Deterministic data
// transforms that run after ToTensor — normalize, and a center crop for
// the test set — are Steps applied to the [0,1] input inside the graph,
// so a user feeds the exported model the same [0,1] tensors whatever the
// data block does.
package onnx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// Versions written: opset 13 (every op used has had its current semantics
// since then or earlier) in IR version 7, which every ONNX runtime since
// ONNX 1.8 (2020) reads.
const (
	OpsetVersion = 13
	IRVersion    = 7
)

// The graph's input and output names.
const (
	InputName  = "image"
	OutputName = "logits"
)

// Weights returns a parameter's trained values as little-endian float32 in
// row-major order, checked against the shape the model needs.
type Weights func(name string, shape []int64) ([]byte, error)

// FromCheckpoint reads parameters from a cnnc checkpoint (safetensors,
// state_dict names; optimizer state and other tensors are ignored). A
// missing tensor, a wrong dtype or shape, or a non-finite value is an error
// naming the file and the tensor.
func FromCheckpoint(f *checkpoint.File) Weights {
	return func(name string, shape []int64) ([]byte, error) {
		t, err := f.Expect(name, checkpoint.F32, shape)
		if err != nil {
			return nil, err
		}
		for i, v := range t.Float32s() {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%s: tensor %q holds %v at element %d", f.Path, name, v, i)
			}
		}
		return t.Data, nil
	}
}

// Options tune Export.
type Options struct {
	// Preprocess are the data block's deterministic transforms of the [0,1]
	// image, applied in order inside the graph before the first layer.
	Preprocess []Step
	// ProducerVersion is cnnc's version, recorded in the model.
	ProducerVersion string
	// DocString describes the model (where it came from).
	DocString string
	// Metadata become the model's metadata_props.
	Metadata map[string]string
}

// Each op's ONNX mapping is in its file in compiler/ops (Def.ONNX): one
// operator with the same evaluation-mode semantics, or several through
// Emit. cross_entropy has none: the loss is not exported, its logits are
// the output.

// Exportable reports whether op has an ONNX mapping.
func Exportable(op ir.Op) bool {
	d := ops.Of(op)
	return d != nil && d.ONNX != nil
}

// exportableOps lists the DSL's ops with a mapping, as the docs order them.
func exportableOps() string {
	var names []string
	for _, d := range ops.DSLOps() {
		if d.ONNX != nil {
			names = append(names, d.DSL.Name)
		}
	}
	return strings.Join(names, ", ")
}

// Export builds the ONNX model of g's logits with parameters from w. An op
// that cannot be exported is a dsl.Diagnostic at its layer's line; bad
// parameters are errors naming the tensor.
func Export(g *ir.Graph, w Weights, opts Options) (*Model, error) {
	image, err := imageInput(g)
	if err != nil {
		return nil, err
	}
	if err := checkLogits(g); err != nil {
		return nil, err
	}
	nodes := logitsCone(g)
	var diags dsl.Diagnostics
	for _, n := range nodes {
		if !Exportable(n.Op) {
			diags = append(diags, dsl.Errorf(n.Pos, "%s: %s cannot be exported to ONNX (exportable: %s)", n.Name, n.Op, exportableOps()))
		}
	}
	if len(diags) > 0 {
		diags.Sort()
		return nil, diags
	}

	b := newBuilder(g.Name, opts.DocString)
	b.names.reserve(InputName)
	b.names.reserve(OutputName)
	used := usedParams(nodes)
	// the parameters, then the buffers the export reads (batch norm's
	// running statistics; not its batch count), in the model's order (the
	// checkpoint's)
	state := append(append([]*ir.Param{}, g.Params...), g.Buffers...)
	for _, p := range state {
		if used[p] {
			b.names.reserve(p.Name)
		}
	}
	for _, p := range state {
		if !used[p] {
			continue
		}
		raw, err := w(p.Name, p.Value.Type.Dims)
		if err != nil {
			return nil, err
		}
		if want := 4 * p.Value.Type.SampleElems(); int64(len(raw)) != want {
			return nil, fmt.Errorf("parameter %s: %d bytes of data, want %d (float32 %s)", p.Name, len(raw), want, p.Value.Type.ShapeString())
		}
		b.initializer(p.Name, p.Value.Type.Dims, raw)
		b.onnxName[p.Value] = p.Name
	}

	first, err := inputShape(image.Type.Dims, opts.Preprocess)
	if err != nil {
		return nil, err
	}
	b.g.Inputs = append(b.g.Inputs, ValueInfo{Name: InputName, ElemType: DataFloat, Dims: batched(first)})
	x, chw := InputName, first
	for _, s := range opts.Preprocess {
		if x, chw, err = s.emit(b, x, chw); err != nil {
			return nil, err
		}
	}
	b.onnxName[image] = x

	for _, n := range nodes {
		if err := b.emit(g, n); err != nil {
			return nil, err
		}
	}
	b.g.Outputs = append(b.g.Outputs, ValueInfo{Name: OutputName, ElemType: DataFloat, Dims: batched(g.Logits.Type.Dims)})

	return &Model{
		IRVersion:       IRVersion,
		Opsets:          []Opset{{Domain: "", Version: OpsetVersion}},
		ProducerName:    "cnnc",
		ProducerVersion: opts.ProducerVersion,
		DocString:       opts.DocString,
		Graph:           b.g,
		Metadata:        opts.Metadata,
	}, nil
}

// imageInput finds the f32 [C,H,W] image input of an unfused graph.
func imageInput(g *ir.Graph) (*ir.Value, error) {
	for _, v := range g.Inputs {
		if v.Role != ir.RoleInput {
			continue
		}
		if v.Type.DType != ir.F32 || !v.Type.Batched || len(v.Type.Dims) != 3 {
			return nil, dsl.Diagnostics{dsl.Errorf(v.Pos, "the image input %s is %s, not f32 [C,H,W]: export takes the forward IR before the fuse pass", v.Name, v.Type)}
		}
		return v, nil
	}
	return nil, fmt.Errorf("model %s has no image input", g.Name)
}

func checkLogits(g *ir.Graph) error {
	l := g.Logits
	if l == nil {
		return fmt.Errorf("model %s has no logits (no cross_entropy loss)", g.Name)
	}
	if l.Type.DType != ir.F32 || !l.Type.Batched || len(l.Type.Dims) != 1 {
		return dsl.Diagnostics{dsl.Errorf(l.Pos, "the logits %s are %s, not f32 [classes]", l.Name, l.Type)}
	}
	if l.Def == nil {
		return dsl.Diagnostics{dsl.Errorf(l.Pos, "the logits %s are not computed by a layer", l.Name)}
	}
	return nil
}

// logitsCone returns the nodes the logits depend on, in schedule order.
func logitsCone(g *ir.Graph) []*ir.Node {
	need := map[*ir.Value]bool{g.Logits: true}
	var cone []*ir.Node
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		hit := false
		for _, v := range n.Outs {
			hit = hit || need[v]
		}
		if !hit {
			continue
		}
		cone = append(cone, n)
		for _, v := range n.Ins {
			need[v] = true
		}
	}
	for i, j := 0, len(cone)-1; i < j; i, j = i+1, j-1 {
		cone[i], cone[j] = cone[j], cone[i]
	}
	return cone
}

func usedParams(nodes []*ir.Node) map[*ir.Param]bool {
	used := map[*ir.Param]bool{}
	for _, n := range nodes {
		for _, v := range n.Ins {
			if v.Role == ir.RoleParam || (v.Role == ir.RoleBuffer && v.Type.DType == ir.F32) {
				used[v.Param] = true
			}
		}
	}
	return used
}

// batched prefixes per-sample dims with the dynamic batch dimension.
func batched(dims []int64) []int64 { return append([]int64{-1}, dims...) }

// builder accumulates the graph; it is the ops' ops.ONNXEmitter.
type builder struct {
	g        Graph
	names    namer
	onnxName map[*ir.Value]string
	logits   *ir.Value
	doc      string // the node being exported, for the ONNX nodes' doc strings
}

// emit adds n's ONNX operators: its op's mapping.
func (b *builder) emit(g *ir.Graph, n *ir.Node) error {
	r := ops.Of(n.Op).ONNX
	b.logits = g.Logits
	b.doc = n.Op.String() + " at " + n.Pos.String()
	if r.Emit != nil {
		if err := r.Emit(b, n); err != nil {
			return dsl.Diagnostics{dsl.Errorf(n.Pos, "%s: %v", n.Name, err)}
		}
		return nil
	}
	ins := n.Ins
	if r.Inputs > 0 {
		ins = ins[:r.Inputs]
	}
	var names []string
	for _, v := range ins {
		names = append(names, b.Name(v))
	}
	var attrs []ops.ONNXAttr
	if r.Attrs != nil {
		attrs = r.Attrs(n)
	}
	b.Node(r.Op, names, []string{b.Output(n.Out())}, attrs...)
	return nil
}

// Name is the ONNX name of a value already in the graph.
func (b *builder) Name(v *ir.Value) string { return b.onnxName[v] }

// Output names an IR value's tensor: the graph output for the logits, else
// a unique name with its value info.
func (b *builder) Output(v *ir.Value) string {
	name := OutputName
	if v != b.logits {
		name = b.names.unique(v.Name)
		b.valueInfo(name, v.Type.Dims)
	}
	b.onnxName[v] = name
	return name
}

// Temp names an intermediate tensor of per-sample dims.
func (b *builder) Temp(base string, dims []int64) string {
	name := b.names.unique(base)
	b.valueInfo(name, dims)
	return name
}

// Node adds an operator, named after its first output.
func (b *builder) Node(op string, ins, outs []string, attrs ...ops.ONNXAttr) {
	var as []Attr
	for _, a := range attrs {
		as = append(as, attrOf(a))
	}
	b.node(Node{Name: outs[0], OpType: op, Inputs: ins, Outputs: outs, Attrs: as, DocString: b.doc})
}

// int64Const adds a 1-D int64 Constant (Pad's pads, Slice's bounds).
func (b *builder) int64Const(base string, vals []int64) string {
	name := b.names.unique(base)
	raw := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	t := &Tensor{Name: name, DataType: DataInt64, Dims: []int64{int64(len(vals))}, Raw: raw}
	b.node(Node{Name: name, OpType: "Constant", Outputs: []string{name}, Attrs: []Attr{{Name: "value", Type: AttrTensor, T: t}}})
	return name
}

// Const adds a float32 constant that is not a parameter: a Constant
// operator, so that the initializers are the model's parameters only.
func (b *builder) Const(base string, dims []int64, vals []float32) string {
	name := b.names.unique(base)
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	t := &Tensor{Name: name, DataType: DataFloat, Dims: dims, Raw: raw}
	b.node(Node{Name: name, OpType: "Constant", Outputs: []string{name}, Attrs: []Attr{{Name: "value", Type: AttrTensor, T: t}}, DocString: b.doc})
	return name
}

func attrOf(a ops.ONNXAttr) Attr {
	switch a.Kind {
	case ops.ONNXInts:
		return intsAttr(a.Name, a.Ints...)
	case ops.ONNXFloat:
		return floatAttr(a.Name, a.Float)
	}
	return intAttr(a.Name, a.Int)
}

func newBuilder(name, doc string) *builder {
	return &builder{g: Graph{Name: name, DocString: doc}, names: namer{}, onnxName: map[*ir.Value]string{}}
}

func (b *builder) node(n Node) { b.g.Nodes = append(b.g.Nodes, n) }

func (b *builder) initializer(name string, dims []int64, raw []byte) {
	b.g.Initializer = append(b.g.Initializer, Tensor{Name: name, DataType: DataFloat, Dims: dims, Raw: raw})
}

// valueInfo records an intermediate tensor's batched shape (for tools and
// the checker's shape inference, which must agree with it).
func (b *builder) valueInfo(name string, dims []int64) {
	b.g.ValueInfo = append(b.g.ValueInfo, ValueInfo{Name: name, ElemType: DataFloat, Dims: batched(dims)})
}

// namer hands out graph-unique tensor names: the IR's own where free,
// else with a .N suffix (the IR's convention).
type namer map[string]bool

func (m namer) reserve(name string) { m[name] = true }

func (m namer) unique(base string) string {
	name := base
	for i := 1; m[name]; i++ {
		name = fmt.Sprintf("%s.%d", base, i)
	}
	m[name] = true
	return name
}

// WriteFile writes an encoded model atomically: path holds either its old
// contents or the whole new model, never a torn file.
func WriteFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	err = func() error {
		if _, err := tmp.Write(data); err != nil {
			return err
		}
		if err := tmp.Chmod(0o644); err != nil { // a model to share, not a secret
			return err
		}
		if err := tmp.Sync(); err != nil {
			return err
		}
		return tmp.Close()
	}()
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		tmp.Close()
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	return nil
}
