package kernelcases

import (
	"math/rand/v2"

	"github.com/cnnc/cnnc/compiler/ir"
)

// BNPoolArgmax replaces the argmax input (the last) of ins, a pooled batch norm gradient n's
// random inputs at batch, with window indices that name positions inside the map, as a forward
// pass writes them: a padded window's random index may name the padding, which no argmax does.
func BNPoolArgmax(n *ir.Node, ins [][]float64, batch int64, rng *rand.Rand) {
	pw, x := n.Attrs.Pool, n.Ins[1].Type
	am := n.Ins[len(n.Ins)-1].Type
	ho, wo := am.Dims[1], am.Dims[2]
	vals := ins[len(ins)-1]
	for o := range vals {
		oy, ox := int64(o)/wo%ho, int64(o)%wo
		var inside []int64
		for ky := int64(0); ky < pw.Kernel[0]; ky++ {
			for kx := int64(0); kx < pw.Kernel[1]; kx++ {
				iy, ix := oy*pw.Stride[0]-pw.Pad[0]+ky, ox*pw.Stride[1]-pw.Pad[1]+kx
				if iy >= 0 && iy < x.Dims[1] && ix >= 0 && ix < x.Dims[2] {
					inside = append(inside, ky*pw.Kernel[1]+kx)
				}
			}
		}
		vals[o] = float64(inside[rng.IntN(len(inside))])
	}
}

// BNPoolEvalModel has batch norms that bnfold leaves (they read an add, not a conv) with their
// activations and max-pools folded in: compiled for evaluation (compiler.Options.Evaluation), its
// pooled normalisations write no argmax (ir.Attrs.NoArgmax) — an overlapping padded 3x3/2 window
// after ReLU (affine) and a 2x2 one after gelu (not affine) on odd maps.
const BNPoolEvalModel = `model BNPoolEval(image: f32[3,9,7], label: class[4]) {
    c1 = conv2d(image, out=5, kernel=3, padding=1)
    s1 = add(c1, c1)
    p1 = maxpool(relu(batchnorm2d(s1)), kernel=3, stride=2, padding=1)
    c2 = conv2d(p1, out=4, kernel=3, padding=1)
    s2 = add(c2, c2)
    p2 = maxpool(gelu(batchnorm2d(s2, affine=false)), kernel=2)
    logits = linear(flatten(p2), out=4)
    loss = cross_entropy(logits, label)
}
train { optimizer = sgd(lr=0.1) }
`
