package compiler

// Misuses of the ops added with the op registry (issue 12), each a
// positioned error; TestErrors runs them with the others.
var opErrorCases = []struct {
	name, src string
	want      []string
}{
	{"same padding with a stride", header + "  c = conv2d(image, out=4, kernel=3, stride=2, padding=\"same\")\n}\n",
		[]string{"m.cnn:2:56: conv2d: padding=\"same\" needs stride 1 (the output keeps the input's size), but stride is 2x2"}},
	{"same padding with an even kernel", header + "  c = conv2d(image, out=4, kernel=[3,2], padding=\"same\")\n}\n",
		[]string{"m.cnn:2:50: conv2d: padding=\"same\" needs an odd kernel, but it is 3x2"}},
	{"padding word", header + "  c = conv2d(image, out=4, kernel=3, padding=\"valid\")\n}\n",
		[]string{"m.cnn:2:46: conv2d: padding must be an integer, a pair [h, w] or \"same\", got \"valid\""}},
	{"groups not dividing the channels", header + "  c = conv2d(image, out=4, kernel=3, groups=2)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: c: conv2d groups=2 must divide the input's 3 channels (image)"}},
	{"groups not dividing out", header + "  c = conv2d(image, out=4, kernel=3, groups=3)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: c: conv2d groups=3 must divide out=4"}},
	{"groups zero", header + "  c = conv2d(image, out=4, kernel=3, groups=0)\n}\n",
		[]string{"m.cnn:2:45: conv2d: groups must be at least 1, got 0"}},
	{"dilation zero", header + "  c = conv2d(image, out=4, kernel=3, dilation=0)\n}\n",
		[]string{"m.cnn:2:47: conv2d: dilation must be at least 1, got 0"}},
	{"dilated window larger than the input", header + "  c = conv2d(image, out=4, kernel=3, dilation=16)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: c: conv2d kernel 3x3 (dilation 16x16: spanning 33x33) (padding 0x0) is larger than its 32x32 input image"}},
	{"slope not a number", header + "  a = leaky_relu(image, slope=\"x\")\n}\n",
		[]string{"m.cnn:2:31: leaky_relu: slope must be a number, got a string"}},
	{"activation arguments", header + "  a = sigmoid(image, 2)\n}\n",
		[]string{"m.cnn:2:7: sigmoid takes 1 tensor argument, got 2"}},
	{"activation keyword", header + "  a = gelu(image, approximate=\"tanh\")\n}\n",
		[]string{"m.cnn:2:19: gelu has no argument \"approximate\"", "gelu takes no keyword arguments"}},
	{"batch norm of one value per channel", "model M(image: f32[3,8,8], label: class[10]) {\n  h = linear(flatten(image), out=16)\n  n = batchnorm1d(h)\n  f = linear(n, out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 1\n}\n",
		[]string{"m.cnn:3:7: n: batch norm needs more than one value per channel to train, but a batch of 1 [B,16] gives one", "the batch is set at m.cnn:8:11"}},
	{"batch norm of maps as features", header + "  n = batchnorm1d(image)\n  f = linear(flatten(n), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: n: batchnorm1d normalises features [B,F], but image is f32[B,3,32,32]: batchnorm2d normalises maps"}},
	{"batch norm of features as maps", header + "  h = linear(flatten(image), out=16)\n  n = batchnorm2d(h)\n  f = linear(n, out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:3:7: n: batchnorm2d normalises maps [B,C,H,W], but h is f32[B,16]: batchnorm1d normalises features"}},
	{"batch norm momentum", header + "  n = batchnorm2d(image, momentum=2)\n}\n",
		[]string{"m.cnn:2:35: batchnorm2d: momentum must be at most 1 (the batch's weight in the running statistics), got 2"}},
	{"batch norm eps", header + "  n = batchnorm2d(image, eps=0)\n}\n",
		[]string{"m.cnn:2:30: batchnorm2d: eps must be positive, got 0"}},
	{"batch norm affine", header + "  n = batchnorm2d(image, affine=1)\n}\n",
		[]string{"m.cnn:2:33: batchnorm2d: affine must be true or false, got integer 1"}},
}

func init() { errorCases = append(errorCases, opErrorCases...) }
