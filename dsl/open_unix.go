//go:build unix

package dsl

import (
	"os"
	"syscall"
)

// openNoBlock opens path for reading without waiting for a FIFO's writer
// (ReadFile then refuses it by its mode).
func openNoBlock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
