// Command fakecuda builds the fake CUDA driver (internal/fakecuda) into a directory:
//
//	go run ./internal/fakecuda/cmd/fakecuda DIR
//	CNNC_FAKECUDA=DIR LD_LIBRARY_PATH=DIR go test -tags cuda ./runtime/cuda/
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cnnc/cnnc/internal/fakecuda"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: fakecuda DIR")
		os.Exit(2)
	}
	dir, err := filepath.Abs(os.Args[1])
	if err == nil {
		err = fakecuda.Build(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("built %s; run under it with %s=%s LD_LIBRARY_PATH=%s\n", filepath.Join(dir, fakecuda.LibName), fakecuda.Env, dir, dir)
}
