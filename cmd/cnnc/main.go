// Command cnnc compiles a CNN described in the cnnc DSL into a
// minimal-memory trainer. See `cnnc -h` and docs/dsl.md.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
