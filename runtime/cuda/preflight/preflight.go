//go:build cuda

// Package preflight starts the CUDA driver before gorgonia.org/cu does, to
// fail with a message that says what to do.
//
// cu's package init calls cuInit and, when it fails (no GPU, no driver),
// prints a bare "Error in initialization" and exits. Go initialises
// packages in import-path order among those whose imports are ready, and
// this package imports neither cu nor anything that does, so its init runs
// first ("github.com/cnnc/..." sorts before "gorgonia.org/cu"): on failure
// it names the driver's error and the two ways out (a GPU machine, or the
// CPU trainer), and exits with the same status. runtime/cuda imports it,
// so every binary that links cu through cnnc gets it.
package preflight

/*
#cgo LDFLAGS: -lcuda
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo linux CFLAGS: -I/usr/local/cuda/include -I/usr/include

#include <cuda.h>

static int cnncInit(const char **name, const char **desc) {
	CUresult r = cuInit(0);
	*name = "?";
	*desc = "?";
	if (r != CUDA_SUCCESS) {
		const char *s = NULL;
		if (cuGetErrorName(r, &s) == CUDA_SUCCESS && s) *name = s;
		s = NULL;
		if (cuGetErrorString(r, &s) == CUDA_SUCCESS && s) *desc = s;
	}
	return (int)r;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
)

// ExitCode is the status a binary exits with when the driver cannot start
// (cu's, too).
const ExitCode = 1

func init() {
	var name, desc *C.char
	if r := C.cnncInit(&name, &desc); r != 0 {
		fmt.Fprint(os.Stderr, Message(filepath.Base(os.Args[0]), int(r), C.GoString(name), C.GoString(desc)))
		os.Exit(ExitCode)
	}
}

// Message is what a binary says when cuInit fails with code (name:
// description).
func Message(prog string, code int, name, desc string) string {
	return fmt.Sprintf(`%s: this program was built for NVIDIA GPUs (-tags cuda, cnnc build --target cuda)
and the CUDA driver cannot start: cuInit: %s (%d: %s).
Run it on a machine with an NVIDIA GPU and its driver, or build it for the CPU:
cnnc build --target cpu (a CUDA trainer's --device cpu cannot help: the driver
starts before main).
`, prog, name, code, desc)
}
