package ir

import "fmt"

// Fused ops: what the compiler's fuse pass turns the unfused training graph
// into, one op per generated kernel family. Their inputs follow fixed
// layouts, which each fused op's file in compiler/ops decodes
// (OpInfo.Layout) into BlockParts:
//
//	to_tensor(u8 image [H,W,C])                          -> f32 [C,H,W] (/255, HWC -> CHW)
//	conv2d_block(x, w, b?)                               -> y, argmax?, z?  conv + bias + act? + maxpool?
//	conv2d_block_grad_input(dOut, w, argmax?, y?, xmask?) -> dX
//	conv2d_block_grad_weight(dOut, x, argmax?, y?, [w, b?, state...]) -> dW, dB? (nothing when the update is fused)
//	linear_block(x, w, b?)                               -> y, z?        linear + bias + act?
//	linear_block_grad_input(dOut, w, y?, xmask?)         -> dX
//	linear_block_grad_weight(dOut, x, y?, [w, b?, state...]) -> dW, dB? (nothing when fused)
//	softmax_cross_entropy(logits, label)                 -> loss, dlogits, correct
//
// and conv2d_tanh_avgpool with its gradients, whose layouts its file
// (compiler/ops/conv_tanh_pool.go) gives: x, w, b? -> pooled, t? forward;
// and the classifier tail (compiler/ops/linear_cross_entropy.go):
//
//	linear_cross_entropy(x, w, b?, label, [w, b?, state...]) -> loss, logits, correct, dX?, [dW, dB?]
//
// argmax is present iff the block has a pool epilogue; y (the block's saved
// output, for the ReLU mask) iff relu && !masked, or, with an activation
// other than ReLU (act), the tensor its derivative reads: y, or z (the
// pre-activation output, the block's last output iff save=true); xmask (the block input,
// whose producer's ReLU mask is applied to dX) iff maskout. The gradient of
// a block output (dOut) is at the block's output resolution: a pooled
// block's backward kernels route it through the argmax on the fly, so the
// full-resolution conv gradient never exists in memory.

// BlockParts names the inputs of a fused node.
type BlockParts struct {
	X, DOut, W, B, Argmax, Y, XMask *Value
	// Params and State are the fused update's inputs (Opt != nil): the
	// parameters, then each parameter's optimizer state in order.
	Params, State []*Value
}

// Parts decodes a fused node's inputs.
func (n *Node) Parts() (BlockParts, error) {
	if layout := n.Op.Info().Layout; layout != nil {
		return layout(n)
	}
	return BlockParts{}, fmt.Errorf("%s is not a fused block", n.Op)
}

// UpdatedParams lists the parameters n updates in place: those of an
// update op, or of a weight-gradient block with its update fused.
func (n *Node) UpdatedParams() []*Param {
	switch {
	case n.Op.Info().Update:
		return []*Param{n.Ins[0].Param}
	case n.Attrs.Opt != nil:
		p, err := n.Parts()
		if err != nil {
			return nil
		}
		var out []*Param
		for _, v := range p.Params {
			out = append(out, v.Param)
		}
		return out
	}
	return nil
}

// MutatedInputs lists the inputs n writes in place besides its outputs
// (OpInfo.Mutates: batch norm's running statistics).
func (n *Node) MutatedInputs() []int {
	if m := n.Op.Info().Mutates; m != nil {
		return m(n)
	}
	return nil
}

// ImageU8Type is how images arrive on the device: decoded uint8 HWC.
func ImageU8Type(chw Type) Type {
	return Type{DType: U8, Batched: true, Dims: []int64{chw.Dims[1], chw.Dims[2], chw.Dims[0]}}
}
