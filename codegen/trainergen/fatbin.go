package trainergen

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
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
	if len(cuSource) == 0 {
		return nil, fmt.Errorf("trainergen: no CUDA source to compile")
	}
	dir, err := os.MkdirTemp("", "cnnc-fatbin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "kernels.cu")
	out := filepath.Join(dir, "kernels.fatbin")
	if err := os.WriteFile(src, cuSource, 0o644); err != nil {
		return nil, err
	}
	if _, err := nvcc.Run(append(FatbinArgs(), "-o", out, src)...); err != nil {
		return nil, fmt.Errorf("trainergen: compiling the kernels to a fatbin: %w", err)
	}
	fatbin, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("trainergen: nvcc wrote no fatbin: %w", err)
	}
	if len(fatbin) == 0 {
		return nil, fmt.Errorf("trainergen: nvcc wrote an empty fatbin")
	}
	if dir := fakecuda.Dir(); dir != "" {
		// Under the fake CUDA driver (tests without a GPU), the fatbin's kernels run on the
		// CPU emulator: give the driver their emulator library.
		if err := fakecuda.Register(dir, fatbin, cuSource); err != nil {
			return nil, err
		}
	}
	return fatbin, nil
}
