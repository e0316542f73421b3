package trainergen

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// FatbinArgs are nvcc's flags for a trainer's kernels, before the -o and
// input file: a fatbin with SASS for every target of internal/nvcc
// (sm_80, sm_90) and PTX for the newest, so later GPUs JIT it.
func FatbinArgs() []string {
	return append([]string{"-fatbin", "-O3"}, nvcc.GencodeArgs()...)
}

// CompileFatbin compiles a program's CUDA C source with nvcc into the
// fatbin a CUDA trainer embeds (runtime/cuda loads it). It needs nvcc, not
// a GPU. A failure includes nvcc's output.
func CompileFatbin(cuSource []byte) ([]byte, error) {
	fatbin, _, err := compileFatbin(cuSource)
	return fatbin, err
}

// CompileFatbinFor compiles spec's kernels as CompileFatbin does and
// checks every launch of its steps against ptxas's report for each
// target: a block that needs more registers or shared memory than the
// GPU has would fail there at launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
// so it fails the build instead, naming the kernel and the numbers.
func CompileFatbinFor(spec *trainer.Spec, cuSource []byte) ([]byte, error) {
	fatbin, ks, err := compileFatbin(cuSource)
	if err != nil {
		return nil, err
	}
	var launches []*codegen.Launch
	for _, st := range []trainer.Step{spec.Train, spec.Eval} {
		for _, l := range st.Launches {
			launches = append(launches, &codegen.Launch{Kernel: l.Kernel, Block: l.Block, SharedBytes: l.SharedBytes})
		}
	}
	reported := map[string]int{}
	for _, k := range ks {
		reported[k.Name]++
	}
	for _, l := range launches {
		if reported[l.Kernel] < len(nvcc.Targets) {
			return nil, fmt.Errorf("trainergen: ptxas reported on kernel %s for %d of the %d targets", l.Kernel, reported[l.Kernel], len(nvcc.Targets))
		}
	}
	if errs := codegen.CheckLaunchResources(launches, ks); len(errs) > 0 {
		return nil, fmt.Errorf("trainergen: launches that would not start on the GPU: %w", errors.Join(errs...))
	}
	return fatbin, nil
}

// compileFatbin runs nvcc with ptxas's report (-Xptxas -v) and returns the
// fatbin and the report.
func compileFatbin(cuSource []byte) ([]byte, []codegen.PtxasKernel, error) {
	if len(cuSource) == 0 {
		return nil, nil, fmt.Errorf("trainergen: no CUDA source to compile")
	}
	// nvcc.Compile keeps the fatbin and the report by nvcc's version, the flags and the source
	report, fatbin, err := nvcc.Compile(cuSource, "kernels.cu", append(FatbinArgs(), "-Xptxas", "-v"), "kernels.fatbin")
	if err != nil {
		return nil, nil, fmt.Errorf("trainergen: compiling the kernels to a fatbin: %w", err)
	}
	ks, err := codegen.ParsePtxas(bytes.NewReader(report))
	if err != nil {
		return nil, nil, fmt.Errorf("trainergen: reading ptxas's report: %w", err)
	}
	if len(fatbin) == 0 {
		return nil, nil, fmt.Errorf("trainergen: nvcc wrote an empty fatbin")
	}
	if dir := fakecuda.Dir(); dir != "" {
		// Under the fake CUDA driver (tests without a GPU), the fatbin's kernels run on the
		// CPU emulator: give the driver their emulator library.
		if err := fakecuda.Register(dir, fatbin, cuSource); err != nil {
			return nil, nil, err
		}
	}
	return fatbin, ks, nil
}
