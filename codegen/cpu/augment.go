package cpu

import (
	"math"
	"strings"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// The data block's augmentation on the CPU: the kernels that read the raw u8 image (conv blocks
// and their weight gradients, to_tensor) get cnnc_cpu.h's struct A of the list's constants as a
// member of their geometry (G::A) and apply it in their loads (fill_x, ToTensor). Training's
// kernels take two more parameters, the step's scalars (seed, step) and the first sample of the
// micro-batch they cover (codegen's placeLaunch sets it), and draw each sample's box; evaluation's
// read the constant center box.

// augDefs are the struct A constants of list s, for training or evaluation.
func augDefs(s *augment.Spec, eval bool) []def {
	train := !eval && s.Random()
	ev := s.Eval()
	d := []def{{"TRAIN", train}, {"RH", s.H}, {"RW", s.W}, {"C", s.C}, {"OH", s.OutH}, {"OW", s.OutW},
		{"ETOP", ev.Top}, {"ELEFT", ev.Left}, {"EH", ev.Height}, {"EW", ev.Width}}
	crop, cropK, flipK := int64(0), int64(-1), int64(-1)
	var pad int64
	var flipT uint64
	var scale, ratio [2]float64
	mean, std := [3]float32{}, [3]float32{1, 1, 1}
	norm := false
	for k, st := range s.Steps {
		switch st.Kind {
		case augment.RandomCrop:
			crop, cropK, pad = 1, int64(k), st.Padding
		case augment.RandomResizedCrop:
			crop, cropK, scale, ratio = 2, int64(k), st.Scale, st.Ratio
		case augment.HFlip:
			flipK, flipT = int64(k), augment.FlipThreshold(st.P)
		case augment.Normalize:
			norm = true
			for c := range st.Mean {
				mean[c], std[c] = float32(st.Mean[c]), float32(st.Std[c])
			}
		}
	}
	if s.C == 1 {
		mean[1], mean[2], std[1], std[2] = mean[0], mean[0], std[0], std[0]
	}
	lr0, lr1 := 0.0, 0.0
	var fb augment.Params
	if crop == 2 {
		lr0, lr1 = math.Log(ratio[0]), math.Log(ratio[1])
		fb = augment.ResizedCropFallback(augment.Step{Ratio: ratio}, s.H, s.W)
	}
	return append(d, def{"CROP", crop}, def{"CROPK", cropK}, def{"PAD", pad},
		def{"SCALE0", scale[0]}, def{"SCALE1", scale[1]}, def{"LR0", lr0}, def{"LR1", lr1},
		def{"FTOP", fb.Top}, def{"FLEFT", fb.Left}, def{"FH", fb.Height}, def{"FW", fb.Width},
		def{"FLIPK", flipK}, def{"FLIPT", flipT}, def{"NORM", norm},
		def{"M0", mean[0]}, def{"M1", mean[1]}, def{"M2", mean[2]}, def{"S0", std[0]}, def{"S1", std[1]}, def{"S2", std[2]})
}

// augKernel adds, when node n augments, the augmentation struct before a kernel's one struct
// (which gets `using A`; impl then names it as its second), the training kernel's two
// parameters to args and a note to doc.
func augKernel(e codegen.Emitter, n *ir.Node, k kernelSpec, args []codegen.Arg) (kernelSpec, []codegen.Arg) {
	s := n.Attrs.Aug
	if s == nil {
		return k, args
	}
	g := structSpec{k.structs[0].suffix, append(append([]def{}, k.structs[0].defs...), def{"A", memberStruct("a")})}
	k.structs = []structSpec{{"a", augDefs(s, e.Eval())}, g}
	k.impl = strings.Replace(k.impl, "%s", "%[2]s", 1)
	k.doc = strings.TrimSuffix(k.doc, ".") + "; augmented in the loads (" + s.String() + ")."
	if !e.Eval() && s.Random() {
		args = append(args, codegen.Arg{Kind: kernelarg.Scalars}, codegen.Arg{Kind: kernelarg.Int, Int: 0})
		k.doc = strings.TrimSuffix(k.doc, ".") + ", random per sample."
		k.nparams = len(args)
	}
	return k, args
}
