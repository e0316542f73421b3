package kernelcases

import "fmt"

// BNActs are the activations the fuse pass folds into batch norm besides ReLU (Attrs.Act), as
// the DSL writes them (%s: the normalisation).
var BNActs = []string{"leaky_relu(%s, slope=0.2)", "sigmoid(%s)", "tanh(%s)", "gelu(%s)", "silu(%s)", "hardswish(%s)"}

// BNActModel is codegen/testdata/bnrelu_odd.cnn's network with act (one of BNActs) in place of
// relu: a conv, batch norm over maps (affine) and act, a max-pool, a linear layer, batch norm
// over features (not affine) and act, the logits. Both targets' step tests train it; one model
// an activation, as a chain of many batch norms over 3 samples (3 values a feature) amplifies
// fp32 rounding beyond the tolerance within a few steps whatever the kernels do.
func BNActModel(act string) string {
	return fmt.Sprintf(`model BNActOdd(image: f32[3,7,5], label: class[4]) {
    c  = conv2d(image, out=5, kernel=3, padding=1, bias=false)
    r  = %s
    p  = maxpool(r, kernel=2)
    f  = linear(flatten(p), out=9, bias=false)
    rf = %s
    logits = linear(rf, out=4)
    loss = cross_entropy(logits, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`, fmt.Sprintf(act, "batchnorm2d(c)"), fmt.Sprintf(act, "batchnorm1d(f, affine=false)"))
}
