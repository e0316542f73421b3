//go:build !unix

package dsl

import "os"

// openNoBlock opens path for reading (ReadFile stats it first).
func openNoBlock(path string) (*os.File, error) { return os.Open(path) }
