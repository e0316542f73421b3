package trainergen

import (
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

// The CPU target (codegen/cpu, runtime/native): the same memory plan — its workspace sized for
// both targets' kernels (cpu.Workspace), so cnnc plan's peak is the CPU trainer's arena too —
// and the same Spec, with launches of kernels generated for the CPU.

// CompileCPU is Compile for the CPU target: Compiled.Kernels is the kernels' C++ source.
func CompileCPU(res *compiler.Result, budget int64, budgetSource string) (*Compiled, error) {
	cfg := plan.Config{Budget: budget, BudgetSource: budgetSource}
	if budgetSource == "" && budget > 0 {
		cfg.BudgetPos = res.Train.Pos["memory_budget"]
	}
	return CompilePlanCPU(res, cfg)
}

// CompilePlanCPU is CompilePlan for the CPU target.
func CompilePlanCPU(res *compiler.Result, cfg plan.Config) (*Compiled, error) {
	cfg.Workspace = cpu.Workspace
	return compilePlan(res, cfg, cpu.Target)
}
