package onnx

import (
	"encoding/binary"
	"math"
	"sort"
)

// The ONNX messages the exporter writes, as plain structs, and their
// protobuf encoding. Field numbers are onnx.proto's (onnx/onnx.proto3);
// only the fields cnnc sets exist here. Repeated scalars are written
// unpacked, as onnx.proto (proto2) declares them; protobuf parsers accept
// both forms.

// Model is ModelProto.
type Model struct {
	IRVersion       int64
	Opsets          []Opset
	ProducerName    string
	ProducerVersion string
	DocString       string
	Graph           Graph
	Metadata        map[string]string // metadata_props, written sorted by key
}

// Opset is OperatorSetIdProto.
type Opset struct {
	Domain  string
	Version int64
}

// Graph is GraphProto.
type Graph struct {
	Name        string
	DocString   string
	Nodes       []Node
	Initializer []Tensor
	Inputs      []ValueInfo
	Outputs     []ValueInfo
	ValueInfo   []ValueInfo
}

// Node is NodeProto.
type Node struct {
	Name      string
	OpType    string
	Inputs    []string
	Outputs   []string
	Attrs     []Attr
	DocString string
}

// Attr is AttributeProto: a FLOAT, INT, INTS or TENSOR attribute (all
// cnnc needs).
type Attr struct {
	Name string
	Type AttrType
	F    float32
	I    int64
	Ints []int64
	T    *Tensor
}

// AttrType is AttributeProto.AttributeType.
type AttrType int64

const (
	AttrFloat  AttrType = 1
	AttrInt    AttrType = 2
	AttrTensor AttrType = 4
	AttrInts   AttrType = 7
)

func intAttr(name string, v int64) Attr      { return Attr{Name: name, Type: AttrInt, I: v} }
func intsAttr(name string, vs ...int64) Attr { return Attr{Name: name, Type: AttrInts, Ints: vs} }
func floatAttr(name string, v float32) Attr  { return Attr{Name: name, Type: AttrFloat, F: v} }

// Tensor is TensorProto with its data in raw_data (little-endian).
type Tensor struct {
	Name     string
	DataType int32
	Dims     []int64
	Raw      []byte
}

// TensorProto.DataType values.
const (
	DataFloat int32 = 1
	DataInt64 int32 = 7
)

// ValueInfo is ValueInfoProto of a tensor type. A negative dimension is
// symbolic: it is written as dim_param BatchDim.
type ValueInfo struct {
	Name     string
	ElemType int32
	Dims     []int64
}

// BatchDim is the name of the dynamic batch dimension.
const BatchDim = "batch"

// Marshal encodes m as a ModelProto.
func (m *Model) Marshal() []byte {
	var e enc
	e.varint(1, uint64(m.IRVersion))
	e.str(2, m.ProducerName)
	e.str(3, m.ProducerVersion)
	e.str(6, m.DocString)
	e.msg(7, m.Graph.marshal())
	for _, o := range m.Opsets {
		var oe enc
		oe.str(1, o.Domain)
		oe.varint(2, uint64(o.Version))
		e.msg(8, oe.b)
	}
	keys := make([]string, 0, len(m.Metadata))
	for k := range m.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var kv enc
		kv.str(1, k)
		kv.str(2, m.Metadata[k])
		e.msg(14, kv.b)
	}
	return e.b
}

func (g *Graph) marshal() []byte {
	var e enc
	for i := range g.Nodes {
		e.msg(1, g.Nodes[i].marshal())
	}
	e.str(2, g.Name)
	for i := range g.Initializer {
		e.msg(5, g.Initializer[i].marshal())
	}
	e.str(10, g.DocString)
	for _, v := range g.Inputs {
		e.msg(11, v.marshal())
	}
	for _, v := range g.Outputs {
		e.msg(12, v.marshal())
	}
	for _, v := range g.ValueInfo {
		e.msg(13, v.marshal())
	}
	return e.b
}

func (n *Node) marshal() []byte {
	var e enc
	for _, s := range n.Inputs {
		e.strAlways(1, s)
	}
	for _, s := range n.Outputs {
		e.strAlways(2, s)
	}
	e.str(3, n.Name)
	e.str(4, n.OpType)
	for _, a := range n.Attrs {
		e.msg(5, a.marshal())
	}
	e.str(6, n.DocString)
	return e.b
}

func (a *Attr) marshal() []byte {
	var e enc
	e.str(1, a.Name)
	switch a.Type {
	case AttrFloat:
		e.fixed32(2, math.Float32bits(a.F))
	case AttrInt:
		e.varint(3, uint64(a.I))
	case AttrTensor:
		e.msg(5, a.T.marshal())
	case AttrInts:
		for _, v := range a.Ints {
			e.varint(8, uint64(v))
		}
	}
	e.varint(20, uint64(a.Type))
	return e.b
}

func (t *Tensor) marshal() []byte {
	var e enc
	for _, d := range t.Dims {
		e.varint(1, uint64(d))
	}
	e.varint(2, uint64(t.DataType))
	e.str(8, t.Name)
	e.bytes(9, t.Raw)
	return e.b
}

func (v ValueInfo) marshal() []byte {
	var shape enc
	for _, d := range v.Dims {
		var dim enc
		if d < 0 {
			dim.str(2, BatchDim) // dim_param
		} else {
			dim.varint(1, uint64(d)) // dim_value
		}
		shape.msg(1, dim.b)
	}
	var tensor enc
	tensor.varint(1, uint64(v.ElemType))
	tensor.msg(2, shape.b)
	var typ enc
	typ.msg(1, tensor.b) // TypeProto.tensor_type
	var e enc
	e.str(1, v.Name)
	e.msg(2, typ.b)
	return e.b
}

// enc appends protobuf fields to b.
type enc struct{ b []byte }

const (
	wireVarint  = 0
	wireBytes   = 2
	wireFixed32 = 5
)

func (e *enc) tag(field, wire int) { e.b = binary.AppendUvarint(e.b, uint64(field)<<3|uint64(wire)) }

// varint writes an integer field; negative int64s are their two's
// complement (ten bytes), as protobuf's int64 requires.
func (e *enc) varint(field int, v uint64) {
	e.tag(field, wireVarint)
	e.b = binary.AppendUvarint(e.b, v)
}

// fixed32 writes a 4-byte field (a float).
func (e *enc) fixed32(field int, v uint32) {
	e.tag(field, wireFixed32)
	e.b = binary.LittleEndian.AppendUint32(e.b, v)
}

func (e *enc) bytes(field int, p []byte) {
	e.tag(field, wireBytes)
	e.b = binary.AppendUvarint(e.b, uint64(len(p)))
	e.b = append(e.b, p...)
}

// str writes a string field unless it is empty (proto3's default).
func (e *enc) str(field int, s string) {
	if s != "" {
		e.strAlways(field, s)
	}
}

// strAlways writes a string field even when empty: an element of a
// repeated field (a node's omitted optional input is "").
func (e *enc) strAlways(field int, s string) { e.bytes(field, []byte(s)) }

// msg writes an embedded message.
func (e *enc) msg(field int, p []byte) { e.bytes(field, p) }
