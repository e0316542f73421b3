//go:build ignore

// Command ptxas_report (`make kernels-report`) compiles each model given
// on the command line, generates its training step's kernels and prints
// what ptxas reports about each one for every GPU target: registers,
// static and dynamic shared memory, stack frame and spills. It exits 1 if
// any kernel spills or uses a local-memory stack frame, or if a launch
// needs more registers or shared memory than a block may have.
//
//	go run codegen/ptxas_report.go [-batch 32] examples/simplecnn.cnn ...
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/internal/nvcc"
)

func main() {
	batch := flag.Int64("batch", 32, "batch size the kernels are generated for")
	flag.Parse()
	dirty := 0
	for _, path := range flag.Args() {
		src, err := os.ReadFile(path)
		if err != nil {
			fail(err)
		}
		res, err := compiler.CompileSource(path, src, compiler.Options{Batch: *batch})
		if err != nil {
			fail(err)
		}
		prog, err := codegen.Generate(res.Graph, codegen.Options{Batch: *batch, SourceName: path})
		if err != nil {
			fail(err)
		}
		ks, err := codegen.CompilePtxas(prog.Source, path, nvcc.Targets)
		if err != nil {
			fail(err)
		}
		fmt.Printf("# %s at batch %d: %d kernels, %d launches\n", path, *batch, len(prog.Kernels), len(prog.Launches))
		codegen.WritePtxasReport(os.Stdout, prog, ks)
		for _, k := range ks {
			if !k.Clean() {
				fmt.Printf("SPILLS: %s\n", k)
				dirty++
			}
		}
		for _, err := range codegen.CheckLaunchResources(prog.Launches, ks) {
			fmt.Printf("DOES NOT FIT: %v\n", err)
			dirty++
		}
		fmt.Println()
	}
	if dirty > 0 {
		fmt.Printf("%d kernels spill, use a local-memory stack frame, or need more registers or shared memory than a block has\n", dirty)
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kernels-report:", err)
	os.Exit(1)
}
