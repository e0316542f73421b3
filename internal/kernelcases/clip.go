package kernelcases

// ClipModel is a small SimpleCNN (odd sizes: 4 and 5 channels, 12 features, 14x13 images) whose
// train block clips the gradients' global norm to a max_norm (0.01) so small that the coefficient
// is far below 1 at every step, with optimizer opt: the clipping whole-step tests of both targets.
func ClipModel(opt string) string {
	return `model S(image: f32[3,14,13], label: class[10]) {
    conv1 = conv2d(image, out=4, kernel=3)
    relu1 = relu(conv1)
    pool1 = maxpool(relu1, kernel=2)
    conv2 = conv2d(pool1, out=5, kernel=3)
    relu2 = relu(conv2)
    pool2 = maxpool(relu2, kernel=2)
    fc1   = linear(flatten(pool2), out=12)
    fc2   = linear(fc1, out=10)
    loss  = cross_entropy(fc2, label)
}
train {
    optimizer = ` + opt + `
    clip_grad_norm = 0.01
}
`
}
