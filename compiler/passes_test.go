package compiler

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./compiler -run %s -update", t.Name())
	assert.Equal(t, string(want), got, "%s differs; if the change is intended, rerun with -update and review the diff", path)
}

// TestPassesBeforeAfter runs each pass of the table alone on the IR the
// previous passes left, and compares the IR text with one golden file per
// pass output (NAME.lower.ir is the lowered input to the first pass,
// NAME.PASS.ir what PASS leaves); the verifier runs after every pass.
func TestPassesBeforeAfter(t *testing.T) {
	for _, c := range []struct{ name, path string }{
		{"mnist", "../examples/mnist.cnn"},
		{"residual", "testdata/residual.cnn"},
		{"unused", "testdata/unused.cnn"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, g := lowerForPasses(t, c.path)
			golden(t, filepath.Join("passes", c.name+".lower.ir"), g.Text())
			for _, p := range Passes {
				if !p.Mode.runsIn(false) {
					continue
				}
				before := g.Text()
				require.NoError(t, p.Fn(ctx, g))
				require.False(t, ctx.Diags.HasErrors(), "%v", ctx.Diags)
				require.NoError(t, g.Verify(), "after %s:\n%s", p.Name, g.Text())
				after := g.Text()
				golden(t, filepath.Join("passes", c.name+"."+p.Name+".ir"), after)
				if p.Name != "dce" || c.name == "unused" {
					// every pass but a dce with nothing to remove changes the IR
					assert.NotEqual(t, before, after, "pass %s changed nothing", p.Name)
				} else {
					assert.Equal(t, before, after, "dce removed something from %s", c.name)
				}
			}
		})
	}
}

// lowerForPasses parses and lowers the model at path and returns the
// context and graph the passes table runs on (as Compile sets them up).
func lowerForPasses(t *testing.T, path string) (*Context, *ir.Graph) {
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	f, err := dsl.Parse(filepath.Base(path), src)
	require.NoError(t, err)
	g, diags := Lower(f)
	require.False(t, diags.HasErrors(), "%v", diags)
	train, diags := ParseTrain(f.Section("train"))
	require.False(t, diags.HasErrors(), "%v", diags)
	g.Opt = &train.Optimizer
	return &Context{File: f, Train: train}, g
}

// TestInferencePassesBeforeAfter is TestPassesBeforeAfter for an
// inference compilation (Options.Infer: shapes, dce, infer, bnfold, fuse):
// one golden per pass output, NAME.infer.PASS.ir, the verifier after
// each. bnfold.cnn has batch norms after a conv without bias, after a conv
// with one (affine=false), and after a linear layer (not folded).
func TestInferencePassesBeforeAfter(t *testing.T) {
	for _, c := range []struct{ name, path string }{
		{"bnfold", "testdata/bnfold.cnn"},
		{"mnist", "../examples/mnist.cnn"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, g := lowerForPasses(t, c.path)
			var ran []string
			for _, p := range Passes {
				if !p.Mode.runsIn(true) {
					continue
				}
				ran = append(ran, p.Name)
				before := g.Text()
				require.NoError(t, p.Fn(ctx, g))
				require.False(t, ctx.Diags.HasErrors(), "%v", ctx.Diags)
				require.NoError(t, g.Verify(), "after %s:\n%s", p.Name, g.Text())
				after := g.Text()
				golden(t, filepath.Join("passes", c.name+".infer."+p.Name+".ir"), after)
				if p.Name == "dce" || (p.Name == "bnfold" && c.name == "mnist") {
					assert.Equal(t, before, after, "%s changed %s", p.Name, c.name)
				} else {
					assert.NotEqual(t, before, after, "pass %s changed nothing", p.Name)
				}
			}
			assert.Equal(t, []string{"shapes", "dce", "infer", "bnfold", "fuse"}, ran)
			assert.True(t, g.Infer)
			assert.Nil(t, g.Loss)
			for _, n := range g.Nodes {
				assert.NotEqual(t, ir.OpConv2D, n.Op, "an unfused conv is left: %s", n.Text())
				assert.False(t, n.Op.Info().EvalIdentity, "%s", n.Text())
			}
		})
	}
}

// The table's order respects every constraint, and checkPassOrder catches
// a table that does not: each constraint broken alone by swapping its two
// passes, and a constraint naming a pass that is gone.
func TestPassOrderIsChecked(t *testing.T) {
	require.NoError(t, checkPassOrder(Passes))
	index := map[string]int{}
	for i, p := range Passes {
		index[p.Name] = i
	}
	for _, c := range passOrder {
		swapped := append([]Pass(nil), Passes...)
		i, j := index[c.before], index[c.after]
		swapped[i], swapped[j] = swapped[j], swapped[i]
		assert.ErrorContains(t, checkPassOrder(swapped), fmt.Sprintf("pass %s must run before %s", c.before, c.after))
	}
	var withoutDCE []Pass
	for _, p := range Passes {
		if p.Name != "dce" {
			withoutDCE = append(withoutDCE, p)
		}
	}
	assert.ErrorContains(t, checkPassOrder(withoutDCE), "names a pass not in the table")
}

// RunPasses runs the verifier after every pass and names the pass that
// broke the graph.
func TestRunPassesVerifiesEveryPass(t *testing.T) {
	saved := Passes
	defer func() { Passes = saved }()
	breakGraph := func(_ *Context, g *ir.Graph) error {
		g.Nodes = append(g.Nodes, g.Nodes[0]) // a node defined twice
		return nil
	}
	Passes = append(append([]Pass(nil), saved...), Pass{Name: "broken", Fn: breakGraph})
	_, err := CompileSource("m.cnn", []byte(header+"  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "internal error: the IR after pass broken is invalid")
	assert.Contains(t, err.Error(), "defined twice")
}

// The IR text is deterministic: compiling twice prints the same bytes.
func TestIRTextIsDeterministic(t *testing.T) {
	a := compileFile(t, "testdata/residual.cnn", Options{}).Graph.Text()
	b := compileFile(t, "testdata/residual.cnn", Options{}).Graph.Text()
	assert.Equal(t, a, b)
	assert.True(t, strings.HasPrefix(a, "graph Residual\n"))
}

func TestDumpAfterStopsAtThePass(t *testing.T) {
	var seen []string
	_, err := CompileSource("m.cnn", []byte(header+"  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{
		StopAfter: "dce",
		AfterPass: func(pass string, g2 *ir.Graph) error { seen = append(seen, pass); return nil },
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"shapes", "dce"}, seen)
}

// An evaluation compilation (Options.Evaluation: a trainer's evaluation
// step) runs the inference passes but keeps the loss and labels: batch
// norm folded, dropout gone, forward blocks without argmax, and the fused
// softmax cross-entropy that counts the correct predictions.
func TestEvaluationCompilation(t *testing.T) {
	res := compileFile(t, "testdata/bnfold.cnn", Options{Evaluation: true})
	g := res.Graph
	require.True(t, g.Eval)
	require.False(t, g.Infer)
	require.NotNil(t, g.Loss)
	assert.Equal(t, ir.OpSoftmaxCrossEntropy, g.Loss.Def.Op)
	assert.Len(t, g.Inputs, 2)
	folds := 0
	for _, p := range g.Params {
		if p.Fold != nil {
			folds++
		}
	}
	assert.Equal(t, 4, folds)
	for _, n := range g.Nodes {
		assert.Equal(t, ir.Forward, n.Phase, n.Text())
		assert.False(t, n.Op.Info().EvalIdentity, n.Text())
		assert.NotEqual(t, ir.OpConv2D, n.Op, n.Text())
	}
}
