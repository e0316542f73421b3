// Command fakenccl builds the fake NCCL library (internal/fakenccl) into a directory:
//
//	go run ./internal/fakenccl/cmd/fakenccl DIR
//	LD_LIBRARY_PATH=DIR ./trainer ...   # loads DIR/libnccl.so.2
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cnnc/cnnc/internal/fakenccl"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: fakenccl DIR")
		os.Exit(2)
	}
	dir, err := filepath.Abs(os.Args[1])
	if err == nil {
		err = fakenccl.Build(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("built %s; run under it with LD_LIBRARY_PATH=%s\n", filepath.Join(dir, fakenccl.LibName), dir)
}
