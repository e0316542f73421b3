package ops_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

var update = flag.Bool("update", false, "rewrite the generated tables of docs/dsl.md")

// Every op of the IR's table is registered and has every piece the
// pipeline needs; a missing one fails here, naming the op and the piece.
func TestEveryOpIsComplete(t *testing.T) {
	require.Equal(t, ir.NumOps(), len(ops.All()), "every op of the IR's table is registered")
	for _, d := range ops.All() {
		for _, m := range ops.Missing(d) {
			t.Errorf("op %s lacks %s", d.Name, m)
		}
		if err := codegen.CheckBinding(d.Op); err != nil {
			t.Errorf("op %s: kernel binding: %v", d.Name, err)
		}
		if r := d.Kernel.ReplacedBy; r != "" {
			op, ok := ir.OpByName(r)
			if assert.True(t, ok, "op %s is replaced by %s, which is no op", d.Name, r) {
				assert.NoError(t, codegen.CheckBinding(op), "%s replaces %s", r, d.Name)
			}
		}
	}
	for _, o := range ops.Optimizers() {
		for _, m := range ops.MissingOptimizer(o) {
			t.Errorf("optimizer %s lacks %s", o.Name, m)
		}
	}
}

// The missing pieces are named.
func TestMissingNamesThePiece(t *testing.T) {
	d := &ops.Def{OpInfo: ir.OpInfo{Name: "frob"}, DSL: &ops.DSL{Name: "frob", Tensors: 1, Shape: "same shape", Examples: []string{"frob(x)"}}}
	m := ops.Missing(d)
	assert.Contains(t, m, "a type rule (Infer)")
	assert.Contains(t, m, "a float64 reference kernel (Ref)")
	assert.Contains(t, m, "a gradient rule (Grad) or a reason for none (NoGrad)")
	assert.Contains(t, m, "an ONNX mapping (ONNX) or a reason for none (NoONNX)")
}

// The op and optimizer tables of docs/dsl.md are the registry's.
func TestDocs(t *testing.T) {
	const path = "../../docs/dsl.md"
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	want, err := ops.ReplaceTables(string(doc))
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
		return
	}
	if want != string(doc) {
		// compare the tables only, so that the failure shows what changed
		assert.Equal(t, ops.OpTable()+ops.OptimizerTable(), tables(string(doc)), "docs/dsl.md's generated tables are stale: go test ./compiler/ops -run TestDocs -update")
		t.Fatal("docs/dsl.md is stale: go test ./compiler/ops -run TestDocs -update")
	}
}

// tables returns the text between the markers of docs/dsl.md.
func tables(doc string) string {
	var out string
	for _, m := range [][2]string{{ops.OpTableBegin, ops.OpTableEnd}, {ops.OptimizerTableBegin, ops.OptimizerTableEnd}} {
		if i := strings.Index(doc, m[0]); i >= 0 {
			rest := doc[i+len(m[0])+1:]
			if j := strings.Index(rest, m[1]); j >= 0 {
				out += rest[:j]
			}
		}
	}
	return out
}
