package dsl

import (
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/cnnc/cnnc/runtime/units"
)

// MaxSourceBytes bounds a model file: a hand-written model is a few
// kilobytes; 8 MiB leaves room for generated ones (tens of thousands of
// layers) while keeping every stage's work and memory bounded.
const MaxSourceBytes = 8 << 20

// ReadFile reads a model file for Parse. It refuses what is not a regular
// file (a directory, a device such as /dev/zero, a FIFO, a socket: reading
// one would never end or never start) and files over MaxSourceBytes,
// naming the path and the limit; it reads at most MaxSourceBytes+1 bytes
// whatever the file claims.
func ReadFile(path string) ([]byte, error) {
	// stat first: opening a FIFO for reading blocks until a writer comes
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	f, err := openNoBlock(path) // it may have changed since
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	if st.Size() > MaxSourceBytes {
		return nil, tooLarge(path)
	}
	src, err := io.ReadAll(io.LimitReader(f, MaxSourceBytes+1))
	if err != nil {
		return nil, err
	}
	if len(src) > MaxSourceBytes { // it grew while we read
		return nil, tooLarge(path)
	}
	return src, nil
}

func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is %s, not a model file: give the path of a .cnn text file", Printable(path), fileKind(m))
}

func tooLarge(path string) error {
	return fmt.Errorf("%s is larger than %s (%d bytes), the most a model file may hold", Printable(path), units.FormatBytes(MaxSourceBytes), MaxSourceBytes)
}

func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file"
}
