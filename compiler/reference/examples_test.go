package reference

import (
	"testing"

	"github.com/cnnc/cnnc/compiler/ops"
)

// Every example of every DSL op (each attribute variant its file lists),
// in the ops' harness model: analytic gradients against central finite
// differences of the loss, for every parameter — those of the layers
// before the op too, so the op's input gradient is checked.
func TestFiniteDifferenceEveryOpExample(t *testing.T) {
	for _, d := range ops.DSLOps() {
		for _, call := range d.DSL.Examples {
			t.Run(call, func(t *testing.T) {
				g := compileWith(t, ops.ExampleModel(d, call), "fuse")
				checkGradients(t, g, 3, 11)
			})
		}
	}
}
