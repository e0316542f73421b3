package kernelcases

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
