//go:build unix

package regularfile

import (
	"os"
	"syscall"
)

// openNonBlocking opens read-only with O_NONBLOCK, so that a FIFO put in
// place after the stat does not block the open (its fstat then refuses
// it). For regular files O_NONBLOCK changes nothing.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
