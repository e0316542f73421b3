package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// to_tensor: uint8 HWC images -> float CHW in [0,1], torchvision's
// ToTensor, for layers other than a convolution reading the image (convs
// convert in their loads). The fuse pass makes it; the image needs no
// gradient.

var _ = Register(ir.OpToTensor, &Def{
	OpInfo: ir.OpInfo{Name: "to_tensor", Infer: inferToTensor, FLOPs: flopsPerOutput(1)},
	Doc:    "uint8 HWC pixels to float CHW in [0,1]",
	NoGrad: "the image needs no gradient",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		if a := n.Attrs.Aug; a != nil {
			return [][]float64{Augmented(a, env, ins[0])}
		}
		return [][]float64{HWCToCHW(ins[0], env.Batch, n.Ins[0].Type)}
	},
	Kernel: Kernel{Custom: "to_tensor"},
})

func inferToTensor(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if x.DType != ir.U8 || len(x.Dims) != 3 || !x.Batched {
		return nil, fmt.Errorf("to_tensor needs u8[B,H,W,C], got %s", x)
	}
	return []ir.Type{imageView(n.Attrs, x)}, nil
}

// HWCToCHW converts uint8 HWC pixels (as float64 0..255) of type u8 to
// [0,1] CHW, like torchvision's ToTensor.
func HWCToCHW(px []float64, batch int, u8 ir.Type) []float64 {
	h, w, c := int(u8.Dims[0]), int(u8.Dims[1]), int(u8.Dims[2])
	out := make([]float64, len(px))
	for b := 0; b < batch; b++ {
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				for ch := 0; ch < c; ch++ {
					out[((b*c+ch)*h+y)*w+x] = px[((b*h+y)*w+x)*c+ch] / 255
				}
			}
		}
	}
	return out
}
