package ops

import (
	"fmt"
	"strings"
)

// The harness the generic tests run each op's examples in (DSL.Examples):
// a model whose x, y and z carry gradients (sums of two parametric layers,
// so that no fusion absorbs the op under test) and whose loss reads the
// op's output o through a linear layer. The op's own nodes are those of
// layer "o".

// ExampleImage is the harness's input: odd sizes, so that no kernel's
// tiling happens to fit.
const ExampleImage = "f32[2,9,7]"

// ExampleLayer is the name of the op's layer in the harness.
const ExampleLayer = "o"

// ExampleModel is the source of the harness model around call, an example
// of op d. The op's first input x is [4,9,7] per sample, or [6] for
// feature ops; y and z have x's shape. A loss op (cross_entropy) is the
// model's loss itself, x its logits.
func ExampleModel(d *Def, call string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model T(image: %s, label: class[4]) {\n", ExampleImage)
	if d.Loss {
		fmt.Fprintf(&b, "    x = linear(flatten(image), out=4)\n    %s = %s\n}\n", ExampleLayer, call)
		return b.String()
	}
	layer := "conv2d(image, out=4, kernel=3, padding=1"
	if d.DSL.Features {
		layer = "linear(flatten(image), out=6"
	}
	fmt.Fprintf(&b, "    a = %s)\n    b = %s, bias=false)\n", layer, layer)
	b.WriteString("    x = add(a, b)\n    y = add(b, a)\n    z = add(a, a)\n")
	fmt.Fprintf(&b, "    %s = %s\n", ExampleLayer, call)
	fmt.Fprintf(&b, "    logits = linear(flatten(%s), out=4)\n    loss = cross_entropy(logits, label)\n}\n", ExampleLayer)
	return b.String()
}
