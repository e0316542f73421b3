// Package plan is cnnc's memory planner: it turns a fused training graph
// into a Plan — every kernel of one training step in order, every buffer
// at a fixed offset of one arena — before anything runs.
//
// In:  a verified *ir.Graph after the fuse pass (or any verified training
// graph), a batch size and an optional memory budget.
// Out: a *Plan that codegen and the runtime read and nothing else: buffers
// (name, bytes, offset, category, live range, DSL position, the IR values
// held), steps (kernels in order, recomputations flagged, operands as
// buffer references), micro-batch loops, and ArenaBytes — the one
// allocation the runtime makes, equal to the planned peak by construction.
//
// How (Build): a candidate plan is a set of decisions — which layers run
// their weight gradient first and update separately (so their input
// gradient can overwrite the saved input in place), which saved
// activations to drop and recompute, and which part of the step to run in
// micro-batches. Each candidate is scheduled, its buffers get live ranges
// and are placed by offset (best fit over live intervals), and its peak is
// exact. The search: minimise the peak over the update choices, then drop
// memory-bound values recomputable from saved ones (batch norm's
// normalisation and the activations after it: cheap.go) where that lowers
// it — the plan without a budget; if a budget is set and not met,
// recompute (an exact dynamic programme over chains,
// a greedy heuristic over other DAGs); if still not met, micro-batch the
// activation-heavy trunk or the whole step with the largest micro-batch
// that fits; if nothing fits at micro-batch 1, fail with the smallest
// budget that works. See docs/architecture.md, "Memory planning".
package plan

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// Source is a position in the model file.
type Source struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Col  int    `json:"col"`
}

func source(p dsl.Pos) Source { return Source{File: p.File, Line: p.Line, Col: p.Col} }

func (s Source) String() string { return dsl.Pos{File: s.File, Line: s.Line, Col: s.Col}.String() }

// Category groups buffers in reports and in the memory timeline.
type Category uint8

const (
	CatParam     Category = iota // trainable parameters
	CatState                     // optimizer state (momentum, Adam moments)
	CatGrad                      // parameter gradients (only where an update is not fused)
	CatSaved                     // activations kept (or recomputed) for the backward pass
	CatArgmax                    // packed max-pool argmax bits
	CatTransient                 // everything else: activation gradients, forward-only values, loss
	CatWorkspace                 // kernel scratch space
	CatInput                     // the uint8 image batch and the labels
	CatBuffer                    // the model's buffers (batch norm's running statistics)
	NumCategories
)

var categoryNames = [NumCategories]string{"param", "state", "grad", "saved", "argmax", "transient", "workspace", "input", "buffer"}

var categoryTitles = [NumCategories]string{"parameters", "optimizer state", "gradients", "saved activations", "argmax bits", "transient", "workspace", "input", "model buffers"}

func (c Category) String() string { return categoryNames[c] }

// Title is the category's name in reports.
func (c Category) Title() string { return categoryTitles[c] }

// MarshalText writes the short name, so JSON reads "saved", not 3.
func (c Category) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads the short name.
func (c *Category) UnmarshalText(b []byte) error {
	for i, n := range categoryNames {
		if n == string(b) {
			*c = Category(i)
			return nil
		}
	}
	return fmt.Errorf("unknown buffer category %q", b)
}

// Plan is one training step, planned. JSON field names are snake_case;
// the peak is peak_bytes.
type Plan struct {
	Model string `json:"model"`
	// Inference: the plan of an inference graph (cnnc plan --infer): the
	// forward pass alone, no step of training.
	Inference bool `json:"inference,omitempty"`
	// Batch is the samples per step; a micro-batch loop runs part of the
	// step on MicroBatch samples at a time.
	Batch int64 `json:"batch"`
	// Accumulate > 1: the step is one optimizer update of Batch samples
	// trained as Accumulate micro-batches of Batch/Accumulate with their
	// gradients accumulated (the train block's accumulate); 0 otherwise.
	Accumulate int64 `json:"accumulate,omitempty"`
	// BudgetBytes is the memory budget planned for (0: none).
	BudgetBytes int64 `json:"budget_bytes"`
	// PeakBytes is the planned peak: the arena's size. ArenaBytes is the
	// one allocation the runtime makes; Build asserts they are equal.
	PeakBytes  int64 `json:"peak_bytes"`
	ArenaBytes int64 `json:"arena_bytes"`
	// MaxLiveBytes is the most bytes live during one step; ArenaBytes
	// exceeds it only by placement gaps (fragmentation) and alignment.
	MaxLiveBytes int64 `json:"max_live_bytes"`
	// PeakStep is the first step at which MaxLiveBytes are live.
	PeakStep int `json:"peak_step"`
	// Alignment of every buffer offset, in bytes.
	Alignment int64 `json:"alignment"`

	Buffers []*Buffer `json:"buffers"`
	Steps   []*Step   `json:"steps"`
	Loops   []*Loop   `json:"loops"`
	Params  []Param   `json:"params"`
	// ModelBuffers are the model's buffers (PyTorch's name for state that
	// is not trained: batch norm's running statistics), persistent like
	// the parameters.
	ModelBuffers []Param `json:"model_buffers,omitempty"`
	Choices      Choices `json:"choices"`
	// Clip is what gradient clipping (the train block's clip_grad_norm)
	// costs, when the model clips; nil otherwise.
	Clip *ClipCost `json:"clip,omitempty"`
	// DataParallel: the plan is one rank's of data-parallel training
	// (Config.Ranks > 1; Batch is the rank's share); nil otherwise.
	DataParallel *DataParallel `json:"data_parallel,omitempty"`

	// FLOPs of the planned step (recomputation included) and of the
	// recomputation alone.
	FLOPs      int64 `json:"flops"`
	ExtraFLOPs int64 `json:"extra_flops"`

	// Graph is the scheduled graph the steps run: a copy of the input
	// graph in which the layers listed in Choices.SplitUpdates compute a
	// gradient and have a separate update node. Its nodes are in step order,
	// with those updates in the update phase at the end (a step may run an
	// update earlier; Check verifies the step order).
	Graph *ir.Graph `json:"-"`
}

// Buffer is one region of the arena. Over its live range it may hold
// several IR values in turn: views of one value (flatten, reshape) share
// it, and a kernel that writes its output over a dying input (in place)
// hands the buffer on.
type Buffer struct {
	ID       int      `json:"id"`
	Name     string   `json:"name"`
	Category Category `json:"category"`
	// Type is the first value's type at the buffer's batch, e.g.
	// f32[32,16,63,63].
	Type string `json:"type"`
	// Samples is how many samples of a batched value the buffer holds: the
	// batch, or a loop's micro-batch; 0 for unbatched values.
	Samples int64 `json:"samples"`
	Bytes   int64 `json:"bytes"`
	Offset  int64 `json:"offset"`
	// FirstStep..LastStep (inclusive) is the live range. A buffer local to
	// a loop is live in that range of every iteration (Loop >= 0).
	FirstStep int `json:"first_step"`
	LastStep  int `json:"last_step"`
	Loop      int `json:"loop"`
	// Persistent buffers (parameters, optimizer state) keep their contents
	// from one training step to the next.
	Persistent bool `json:"persistent"`
	// Owner > 0 marks optimizer state that only rank Owner−1 keeps (a
	// sharded optimizer, DataParallel.Shard): the shards of different
	// ranks overlap in the arena, and a rank's live bytes count its own.
	Owner int `json:"owner,omitempty"`
	// RangeElems > 0 marks optimizer state split in element ranges (a
	// sharded optimizer): every rank keeps RangeElems elements of the
	// value in this buffer (Bytes), rank r elements [r·RangeElems,
	// min(n, (r+1)·RangeElems)) of its n.
	RangeElems int64 `json:"range_elems,omitempty"`
	// Recomputed: the buffer holds values recomputed in the backward pass.
	Recomputed bool `json:"recomputed,omitempty"`
	// Holds lists the IR values the buffer holds, in order.
	Holds []Held `json:"holds"`
	// Pos is the DSL position of the layer whose kernel defines the first
	// value (for a fused block, its first layer).
	Pos Source `json:"pos"`
}

// Held is one IR value a buffer holds, from its definition (or the start of
// the step) to its last use.
type Held struct {
	Value     string   `json:"value"`
	Category  Category `json:"category"`
	FirstStep int      `json:"first_step"`
	LastStep  int      `json:"last_step"`
	// InPlace: written by its defining kernel over the previous value.
	InPlace bool `json:"in_place,omitempty"`
	// Views are other names of this value (flatten/reshape outputs).
	Views []string `json:"views,omitempty"`
}

// Step is one kernel launch (per micro-batch inside a loop).
type Step struct {
	Index  int    `json:"index"`
	Kernel string `json:"kernel"` // the op
	Layer  string `json:"layer"`
	NodeID int    `json:"node_id"`
	Phase  string `json:"phase"` // forward, backward, update
	// Recompute: the step re-runs a forward node in the backward pass to
	// rebuild activations that were not kept.
	Recompute bool `json:"recompute,omitempty"`
	// Loop is the index in Plan.Loops of the micro-batch loop the step is
	// in, or -1.
	Loop int `json:"loop"`
	// Samples each launch processes: the batch, or the loop's micro-batch
	// (the last iteration may take fewer).
	Samples int64     `json:"samples"`
	Ins     []Operand `json:"ins"`
	Outs    []Operand `json:"outs"`
	// Accumulate: inside a loop, unbatched outputs (weight gradients, the
	// loss, the correct count) are added to their buffers, which the loop
	// zeroes before its first iteration.
	Accumulate bool `json:"accumulate,omitempty"`
	// FLOPs over the whole step (all iterations of a loop).
	FLOPs int64 `json:"flops"`
	// Workspace is the buffer holding the step's kernel scratch memory, or
	// -1 when its kernels need none.
	Workspace int `json:"workspace"`
	// LiveBytes is the sum of the buffers live during the step.
	LiveBytes int64  `json:"live_bytes"`
	Pos       Source `json:"pos"`
	// Text is the IR node, as printed.
	Text string `json:"text"`
	// Updates names the parameters the step updates (state_dict names):
	// one for a separate sgd_update/adam_update, a layer's weight and bias
	// for a weight-gradient kernel with its update fused.
	Updates []string `json:"updates,omitempty"`

	Node *ir.Node `json:"-"`
}

// Label names the step for people: "linear_block_grad_input fc1",
// "conv2 weight update" (a separate update says which parameter),
// "conv2d_block_grad_weight conv1 (+ weight, bias update)".
func (s *Step) Label() string {
	if op, ok := ir.OpByName(s.Kernel); ok && op.Info().Update {
		return s.Layer + " " + strings.Join(s.updatedParts(), ", ") + " update"
	}
	l := s.Kernel + " " + s.Layer
	if len(s.Updates) > 0 {
		l += " (+ " + strings.Join(s.updatedParts(), ", ") + " update)"
	}
	return l
}

// updatedParts are the updated parameters without the layer's prefix:
// "weight", "bias".
func (s *Step) updatedParts() []string {
	parts := make([]string, len(s.Updates))
	for i, u := range s.Updates {
		parts[i] = strings.TrimPrefix(u, s.Layer+".")
	}
	return parts
}

// Operand is a value a step reads or writes, and where it lives.
type Operand struct {
	Value  string `json:"value"`
	Buffer int    `json:"buffer"`
	// Slice: the step runs on a micro-batch and reads (or writes) that
	// micro-batch's samples of a whole-batch buffer, starting at element
	// first_sample × per-sample elements (for packed argmax too: kernels
	// address bits by element index).
	Slice bool `json:"slice,omitempty"`
	// InPlace (outputs): the buffer held an input of this step, which the
	// kernel overwrites element by element after reading it.
	InPlace bool `json:"in_place,omitempty"`
}

// Loop runs steps FirstStep..LastStep Count times on consecutive
// micro-batches of MicroBatch samples (the last takes what is left).
type Loop struct {
	FirstStep  int   `json:"first_step"`
	LastStep   int   `json:"last_step"`
	MicroBatch int64 `json:"micro_batch"`
	Count      int64 `json:"count"`
	// Zero lists the buffers (accumulators) set to zero before the loop.
	Zero []int `json:"zero"`
	// What the loop covers, in words.
	What string `json:"what"`
}

// Param is a trainable parameter and its buffer.
type Param struct {
	Name   string  `json:"name"` // PyTorch state_dict name, e.g. conv1.weight
	Shape  []int64 `json:"shape"`
	Init   string  `json:"init"`
	Buffer int     `json:"buffer"`
	// State are the optimizer state buffers, in the optimizer's order.
	State []int `json:"state"`
}

// Choices are the decisions the plan made, for reports and tools.
type Choices struct {
	// SplitUpdates lists layers whose weight gradient runs before their
	// input gradient into a gradient buffer, with a separate update, so
	// the input gradient can overwrite the saved input in place.
	SplitUpdates []string `json:"split_updates"`
	// FusedUpdates lists layers whose update stays fused into the weight
	// gradient kernel (no gradient buffer).
	FusedUpdates []string `json:"fused_updates"`
	// InPlace describes each in-place output: "pool1.grad over pool1".
	InPlace []string `json:"in_place"`
	// Recompute lists the forward layers recomputed in the backward pass
	// (a trunk loop recomputes its layers once per micro-batch).
	Recompute []string `json:"recompute"`
	// MicroBatch is the micro-batch size (the batch when there is no loop)
	// and MicroBatched says what runs in micro-batches: "" (nothing),
	// "step" (the whole step) or "trunk" (layers Trunk[0]..Trunk[len-1]).
	MicroBatch   int64    `json:"micro_batch"`
	MicroBatched string   `json:"micro_batched"`
	Trunk        []string `json:"trunk"`
	// Strategy summarises: "fits", "recompute", "micro-batch".
	Strategy string `json:"strategy"`
}

// Offset returns the offset of the buffer holding the value named like v
// (a view resolves to its buffer), when it has exactly one for the whole
// step; a value recomputed in the backward pass has two, so read the
// steps' operands instead. With Bytes, a Plan serves as a value-to-offset
// layout for code that runs Plan.Steps in order — only in that order:
// in-place outputs and reused offsets assume it.
func (p *Plan) Offset(v *ir.Value) (int64, bool) {
	found := -1
	for _, b := range p.Buffers {
		for _, h := range b.Holds {
			names := append([]string{h.Value}, h.Views...)
			for _, n := range names {
				if n == v.Name {
					if found >= 0 && found != b.ID {
						return 0, false
					}
					found = b.ID
				}
			}
		}
	}
	if found < 0 {
		return 0, false
	}
	return p.Buffers[found].Offset, true
}

// Bytes is the arena size (the planned peak).
func (p *Plan) Bytes() int64 { return p.ArenaBytes }

// ClipCost is what gradient clipping costs in the plan. The norm reads
// every gradient before any update, so no update is fused into its weight
// gradient (each layer's gradients go to buffers, kept until the norm and
// their update) and each update is a kernel of its own, after the norm.
type ClipCost struct {
	MaxNorm float64 `json:"max_norm"`
	// NormStep is the step computing the norm and its coefficient.
	NormStep int `json:"norm_step"`
	// GradientBytes are the gradient buffers the norm reads, all live at
	// NormStep; LiveBytes is everything live there.
	GradientBytes int64 `json:"gradient_bytes"`
	LiveBytes     int64 `json:"live_bytes"`
	// NormFLOPs are the norm's; Updates the separate updates after it.
	NormFLOPs int64 `json:"norm_flops"`
	Updates   int   `json:"updates"`
	// UnclippedPeakBytes is the peak of the same model planned without
	// clipping (set by the caller that plans both, cnnc plan; 0: not
	// planned).
	UnclippedPeakBytes int64 `json:"unclipped_peak_bytes,omitempty"`
}
