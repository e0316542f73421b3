package driver_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/examples"
)

func load(t *testing.T, name string, batch int64) *compiler.Result {
	t.Helper()
	src, err := fs.ReadFile(examples.Models, name)
	require.NoError(t, err)
	res, err := driver.Load(name, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	return res
}

// Each target's plan reserves its own kernels' scratch: the trainer's
// arena is the plan's, and every scratch buffer the generated step uses
// lies in its step's workspace (trainergen.Assemble checks both, and
// fails otherwise). The CPU target's plan reserves at least CUDA's
// workspace (the larger of both targets' needs), so cnnc plan's peak
// holds for it too; the emulator runs CUDA's kernels on CUDA's plan.
func TestCompileEachTarget(t *testing.T) {
	res := load(t, "simplecnn.cnn", 32)
	byTarget := map[driver.Target][]byte{}
	peaks := map[driver.Target]int64{}
	for _, tg := range []driver.Target{driver.CUDA, driver.Emu, driver.CPU} {
		c, err := driver.Compile(res, plan.Config{}, tg)
		require.NoError(t, err, tg)
		p, err := driver.Plan(res, plan.Config{}, tg)
		require.NoError(t, err, tg)
		assert.Equal(t, p.PeakBytes, c.Plan.PeakBytes, "%s: Compile plans as Plan does", tg)
		assert.Equal(t, c.Plan.PeakBytes, c.Spec.ArenaBytes, "%s: the trainer allocates the plan's peak", tg)
		assert.Equal(t, 32, c.Spec.Batch)
		byTarget[tg], peaks[tg] = c.Kernels, c.Plan.PeakBytes
	}
	assert.Equal(t, byTarget[driver.CUDA], byTarget[driver.Emu], "the emulator runs the CUDA C")
	assert.NotEqual(t, byTarget[driver.CUDA], byTarget[driver.CPU])
	assert.GreaterOrEqual(t, peaks[driver.CPU], peaks[driver.CUDA])
}

// A budget from the train block is reported at its line; one from a flag
// by the flag's name.
func TestBudgetSource(t *testing.T) {
	res := load(t, "simplecnn.cnn", 32)
	require.NotZero(t, res.Train.MemoryBudget, "simplecnn.cnn has a memory_budget")
	cfg := driver.Budget(res, res.Train.MemoryBudget, "")
	assert.Equal(t, res.Train.Pos["memory_budget"], cfg.BudgetPos)
	cfg = driver.Budget(res, 1e6, "--memory-budget")
	assert.False(t, cfg.BudgetPos.IsValid())
	assert.Equal(t, "--memory-budget", cfg.BudgetSource)
	_, err := driver.Compile(res, cfg, driver.CUDA)
	var be *plan.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "--memory-budget", be.Source)
}

// MaxBatch plans with the target's workspace: its micro-batched answer
// plans within the budget at that batch.
func TestMaxBatch(t *testing.T) {
	res := load(t, "simplecnn.cnn", 32)
	m, err := driver.MaxBatch(res, 40e6, driver.CUDA)
	require.NoError(t, err)
	require.Positive(t, m.MicroBatch.Batch)
	assert.LessOrEqual(t, m.MicroBatch.PeakBytes, int64(40e6))
}

// The driver is the only place that pairs the planner with a code
// generator: outside it (and the planner's own package) no Go file of the
// module calls plan.Build or plan.FindMaxBatch, or gives a plan.Config a
// Workspace function.
func TestOnlyTheDriverWiresPlannerAndCodegen(t *testing.T) {
	root := filepath.Join("..")
	fset := token.NewFileSet()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "driver", filepath.Join("compiler", "plan"), "testdata":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "plan" && (n.Sel.Name == "Build" || n.Sel.Name == "FindMaxBatch") {
					found = append(found, fset.Position(n.Pos()).String()+": plan."+n.Sel.Name)
				}
			case *ast.CompositeLit:
				if sel, ok := n.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Config" {
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Workspace" {
								found = append(found, fset.Position(kv.Pos()).String()+": plan.Config{Workspace: ...}")
							}
						}
					}
				}
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "Workspace" {
						found = append(found, fset.Position(l.Pos()).String()+": .Workspace = ...")
					}
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	assert.Empty(t, found, "plan through package driver instead")
}
