// Package nvcc finds and runs NVIDIA's CUDA compiler. Machines without a
// GPU still have nvcc (Debian's nvidia-cuda-toolkit; `make cuda-toolkit`),
// so every generated kernel is compiled for the real targets in CI.
package nvcc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Targets are the GPU architectures cnnc compiles for: A100 (sm_80) and
// H100/H200 (sm_90).
var Targets = []string{"sm_80", "sm_90"}

// Path returns nvcc's path: $CNNC_NVCC, else nvcc on PATH, else the
// usual /usr/local/cuda/bin/nvcc.
func Path() (string, error) {
	if p := os.Getenv("CNNC_NVCC"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("nvcc"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/local/cuda/bin/nvcc"); err == nil {
		return "/usr/local/cuda/bin/nvcc", nil
	}
	return "", fmt.Errorf("nvcc not found (install it with `make cuda-toolkit`, or set CNNC_NVCC)")
}

// Require returns nvcc's path for a test. Without nvcc the test is skipped
// with a loud message, unless CNNC_REQUIRE_NVCC=1 (as CI sets), where it
// fails.
func Require(t testing.TB) string {
	t.Helper()
	p, err := Path()
	if err == nil {
		return p
	}
	if os.Getenv("CNNC_REQUIRE_NVCC") == "1" {
		t.Fatalf("CNNC_REQUIRE_NVCC=1 but %v", err)
	}
	msg := fmt.Sprintf("!!! SKIPPING %s: %v — kernels are NOT being compiled for the GPU", t.Name(), err)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
	return ""
}

// Run runs nvcc with args and returns its combined output; a failure
// includes the output.
func Run(args ...string) ([]byte, error) {
	p, err := Path()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd := exec.Command(p, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("nvcc %v: %v\n%s", args, err, out.String())
	}
	return out.Bytes(), nil
}

// GencodeArgs returns the -gencode flags for Targets, embedding PTX for
// the newest so that later GPUs can JIT it.
func GencodeArgs() []string {
	var args []string
	for i, sm := range Targets {
		arch := "compute_" + sm[3:]
		code := sm
		if i == len(Targets)-1 {
			code = "[" + sm + "," + arch + "]"
		}
		args = append(args, "-gencode", "arch="+arch+",code="+code)
	}
	return args
}
