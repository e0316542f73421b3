// Package driver runs cnnc's pipeline end to end: parse -> passes ->
// memory plan -> code generation -> (where the caller asks) the trainer
// module and go build.
//
// In:  a model file's text (or a compiled Result), a Target and the
// planner's configuration (batch, budget, forced micro-batch).
// Out: the compiler's Result, the memory plan, and a trainergen.Compiled
// (plan, training and evaluation Programs, kernel source, Spec); Build
// also writes the trainer module and runs nvcc and go build.
//
// Why: the planner places each kernel's scratch memory, which only the
// target's code generator knows the size of (plan.Config.Workspace), and
// the code generator then lays its scratch into the planned workspace
// buffers. The two must agree, so the pairing — which workspace function
// goes with which kernel generator — lives here and nowhere else: cnnc's
// commands, the benchmarks and the tests all plan and generate through
// this package.
package driver

import (
	"errors"
	"fmt"
	"os/exec"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/units"
)

// Target is what the generated kernels run on.
type Target string

const (
	// CUDA is the CUDA C kernels (templates/) on an NVIDIA GPU, built
	// into a fatbin by nvcc.
	CUDA Target = "cuda"
	// Emu is the same CUDA C kernels on cnnc's CUDA emulator (CPU).
	Emu Target = "emu"
	// CPU is codegen/cpu's C++ kernels, compiled into the trainer by cgo.
	CPU Target = "cpu"
)

// generator is the kernel generator of t (nil: codegen's CUDA rules).
func (t Target) generator() codegen.Target {
	if t == CPU {
		return cpu.Target
	}
	return nil
}

// Workspace is the planner's scratch function for t's kernels
// (plan.Config.Workspace) generated as tc says (the precision, and the
// SM count of the GPU: 0 is codegen's default): the CPU target's plan
// reserves the larger of both targets' needs, so that cnnc plan's peak is
// its arena too.
func (t Target) Workspace(tc compiler.TrainConfig) func(n *ir.Node, samples int64) int64 {
	if t == CPU {
		return cpu.Workspace
	}
	return codegen.WorkspaceOn(codegen.Precision(tc.Precision), tc.SMs)
}

// Load parses a model file's text and runs the passes (compiler.Options
// says which, for which batch). Errors are dsl.Diagnostics, except a
// bad option (an unknown pass name).
func Load(name string, src []byte, opts compiler.Options) (*compiler.Result, error) {
	return compiler.CompileSource(name, src, opts)
}

// Budget is the planner's configuration for a memory budget: budget
// bytes (0: none) from source (a flag's name), or from the train block's
// memory_budget when source is empty, whose position a budget no plan
// meets is reported at.
func Budget(res *compiler.Result, budget int64, source string) plan.Config {
	cfg := plan.Config{Budget: budget, BudgetSource: source}
	if source == "" && budget > 0 {
		cfg.BudgetPos = res.Train.Pos["memory_budget"]
	}
	return cfg
}

// Plan plans res's training step at its batch for t's kernels. With
// accumulate = N a step is one update of batch×N samples, planned as N
// micro-batches of the batch.
//
// An inference compilation (compiler.Options.Infer) is planned as its
// forward pass at the batch alone: no accumulation.
func Plan(res *compiler.Result, cfg plan.Config, t Target) (*plan.Plan, error) {
	cfg.Batch, cfg.Accumulate = res.Train.StepBatch(), res.Train.Accumulate
	if res.Graph.Infer {
		cfg.Batch, cfg.Accumulate = res.Train.Batch, 0
	}
	cfg.Workspace = t.Workspace(res.Train)
	return plan.Build(res.Graph, cfg)
}

// MaxBatch is the largest batch of res within budget for t's kernels,
// without recomputation, with it, and with micro-batching.
func MaxBatch(res *compiler.Result, budget int64, t Target) (*plan.MaxBatch, error) {
	return plan.FindMaxBatch(res.Graph, budget, res.BatchLimit, t.Workspace(res.Train))
}

// Compile plans res's memory (cfg's budget or micro-batch; the batch and
// workspace are filled in) and generates t's training and evaluation
// kernels and the Spec.
func Compile(res *compiler.Result, cfg plan.Config, t Target) (*trainergen.Compiled, error) {
	p, err := Plan(res, cfg, t)
	if err != nil {
		return nil, err
	}
	eval, err := evaluation(res)
	if err != nil {
		return nil, err
	}
	return trainergen.Assemble(res, p, t.generator(), eval)
}

// evaluation is res's evaluation compilation (compiler.Options.Evaluation)
// when it folds a batch norm into a conv, so that the trainer's
// evaluation runs the folded kernels; nil when there is nothing to fold
// (evaluation then runs the training graph's forward kernels).
func evaluation(res *compiler.Result) (*compiler.Result, error) {
	ev, err := compiler.Compile(res.File, compiler.Options{Evaluation: true, Batch: res.Train.Batch})
	if err != nil {
		return nil, fmt.Errorf("compiling the evaluation step: %w", err)
	}
	for _, p := range ev.Graph.Params {
		if p.Fold != nil {
			return ev, nil
		}
	}
	return nil, nil
}

// CompileInfer plans an inference compilation (compiler.Options.Infer) at
// its batch and generates t's forward kernels and the inference-only
// build's Spec (trainergen.AssembleInfer).
func CompileInfer(res *compiler.Result, cfg plan.Config, t Target) (*trainergen.Compiled, error) {
	p, err := Plan(res, cfg, t)
	if err != nil {
		return nil, err
	}
	return trainergen.AssembleInfer(res, p, t.generator())
}

// ErrNoGo is Build's error when the Go toolchain is not on PATH.
var ErrNoGo = errors.New("building a trainer needs the Go toolchain on PATH")

// BuildOptions say where Build works and what it reports.
type BuildOptions struct {
	// Dir is the directory the trainer module is written into.
	Dir string
	// Output is the trainer binary go build writes.
	Output string
	// Log receives a line per finished stage (nvcc, the module).
	Log func(string)
}

// Build turns c (Compile's for t) into a trainer binary: for CUDA nvcc's
// fatbin (checked by ptxas against the GPUs' limits), the trainer module
// in o.Dir, then go build.
func Build(c *trainergen.Compiled, t Target, o BuildOptions) error {
	log := o.Log
	if log == nil {
		log = func(string) {}
	}
	tags, err := writeModule(c, t, o.Dir, log)
	if err != nil {
		return err
	}
	log(fmt.Sprintf("wrote the trainer module in %s", o.Dir))
	if _, err := exec.LookPath("go"); err != nil {
		return ErrNoGo
	}
	return trainergen.GoBuild(o.Dir, o.Output, tags, log)
}

// writeModule writes t's trainer module for c into dir and returns the
// build tags it needs.
func writeModule(c *trainergen.Compiled, t Target, dir string, log func(string)) ([]string, error) {
	switch t {
	case CUDA:
		fatbin, err := trainergen.CompileFatbinFor(c.Spec, c.Kernels)
		if err != nil {
			return nil, err
		}
		log(fmt.Sprintf("nvcc: %s fatbin for sm_80 and sm_90 (with PTX); ptxas: all %d launches fit an A100's and an H100's blocks (registers, shared memory)",
			units.FormatBytes(int64(len(fatbin))), len(c.Spec.Train.Launches)+len(c.Spec.Eval.Launches)))
		if err := trainergen.WriteModuleCUDA(dir, c.Spec, c.Kernels, fatbin); err != nil {
			return nil, fmt.Errorf("writing the trainer module: %w", err)
		}
		return trainergen.CUDATags, nil
	case CPU:
		if err := trainergen.WriteModuleCPU(dir, c.Spec, c.Kernels); err != nil {
			return nil, fmt.Errorf("writing the trainer module: %w", err)
		}
	default:
		if err := trainergen.WriteModule(dir, c.Spec, c.Kernels); err != nil {
			return nil, fmt.Errorf("writing the trainer module: %w", err)
		}
	}
	return nil, nil
}

// PackageFiles renders c (Compile's for t) as the Go package pkg of
// `cnnc gen`, by file name: for CPU its kernels compiled into the program
// by cgo (trainergen.PackageFilesCPU); for Emu the CUDA C on the
// emulator; for CUDA the same package with nvcc's fatbin (checked by
// ptxas) and cuda.go, which trains on the GPU in builds with -tags cuda.
func PackageFiles(c *trainergen.Compiled, t Target, pkg string) (map[string][]byte, error) {
	switch t {
	case CPU:
		return trainergen.PackageFilesCPU(pkg, c.Spec, c.Kernels)
	case CUDA:
		fatbin, err := trainergen.CompileFatbinFor(c.Spec, c.Kernels)
		if err != nil {
			return nil, err
		}
		return trainergen.PackageFiles(pkg, c.Spec, c.Kernels, fatbin)
	}
	return trainergen.PackageFiles(pkg, c.Spec, c.Kernels, nil)
}
