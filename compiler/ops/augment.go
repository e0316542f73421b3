package ops

import (
	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/compiler/ir"
)

// The data block's augmentation in the reference: the nodes reading the raw
// image (conv blocks, their weight gradients, to_tensor) carry the list
// (Attrs.Aug) and apply it to each sample as the kernels do while loading.

// AugmentKey is the second word of the Philox key of augmentation draws
// ("AUG1"), so that they never share a counter with dropout's masks.
const AugmentKey = 0x41554731

// AugmentWord is word d of the draw of the sample at position pos of
// training step step: the first word of Philox4x32-10 with counter (pos,
// step, step>>32, d) and key (seed, seed>>32 ^ AugmentKey). Kernels
// compute the same (cnnc_aug_word).
func AugmentWord(seed uint64, step, pos int64, d uint32) uint32 {
	w := Philox4x32([4]uint32{uint32(pos), uint32(uint64(step)), uint32(uint64(step) >> 32), d},
		[2]uint32{uint32(seed), uint32(seed>>32) ^ AugmentKey})
	return w[0]
}

// AugmentParams is sample b's draw in env: training draws at its
// position in the step's batch (FirstSample + b), evaluation takes the
// list's deterministic part.
func AugmentParams(s *augment.Spec, env *RefEnv, b int) augment.Params {
	if !env.Training {
		return s.Eval()
	}
	pos := int64(env.FirstSample + b)
	return s.Draw(func(d uint32) uint32 { return AugmentWord(env.Seed, env.Step, pos, d) })
}

// Augmented is the model's f32 [C,OutH,OutW] input from raw u8 HWC pixels
// (values 0..255) of env.Batch samples.
func Augmented(s *augment.Spec, env *RefEnv, px []float64) []float64 {
	in, out := s.H*s.W*s.C, s.C*s.OutH*s.OutW
	res := make([]float64, int64(env.Batch)*out)
	for b := 0; b < env.Batch; b++ {
		s.Apply(px[int64(b)*in:int64(b+1)*in], AugmentParams(s, env, b), res[int64(b)*out:int64(b+1)*out])
	}
	return res
}

// imageView is the f32 [C,H,W] type a node reading u8 [H,W,C] images
// sees: augmented to the list's output size when it has one.
func imageView(a ir.Attrs, x ir.Type) ir.Type {
	if a.Aug != nil {
		return ir.F32Batched(a.Aug.C, a.Aug.OutH, a.Aug.OutW)
	}
	return ir.F32Batched(x.Dims[2], x.Dims[0], x.Dims[1])
}
