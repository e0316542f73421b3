// Package regularfile opens files that a trainer reads as data —
// checkpoints, MNIST IDX files, images — only when they are regular files.
//
// In:  a path from the user (a flag, a data folder's entry).
// Out: an open *os.File and its size, or an error naming the path.
//
// Why: a path may name a FIFO (opening it blocks until a writer comes), a
// device such as /dev/zero (reading it never ends) or a folder, directly or
// through a link. Such a path is refused by name before anything is read,
// and without blocking: the path is checked with stat (links followed)
// before it is opened, and the opened file is checked again with fstat, so
// a file swapped for a FIFO in between is refused too. Reads are bounded by
// the size fstat gave, never by what the file keeps producing.
package regularfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// ErrNotRegular is what the error of a non-regular path wraps.
var ErrNotRegular = errors.New("not a regular file")

// NotRegularError says what kind of file a path names instead of a
// regular one. It wraps ErrNotRegular; Error does not repeat the path (it
// comes inside an *fs.PathError).
type NotRegularError struct{ Mode fs.FileMode }

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("is %s, not a regular file", Kind(e.Mode))
}

func (e *NotRegularError) Unwrap() error { return ErrNotRegular }

// Kind names the type of a file mode in words ("a named pipe (FIFO)").
func Kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsRegular():
		return "a regular file"
	}
	return "not a file of a known type"
}

// Check returns an *fs.PathError wrapping *NotRegularError when info does
// not describe a regular file.
func Check(path string, info fs.FileInfo) error {
	if info.Mode().IsRegular() {
		return nil
	}
	return &fs.PathError{Op: "open", Path: path, Err: &NotRegularError{Mode: info.Mode()}}
}

// Stat is os.Stat (links followed) that also refuses non-regular files.
func Stat(path string) (fs.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := Check(path, st); err != nil {
		return nil, err
	}
	return st, nil
}

// Open opens a regular file for reading, refusing anything else without
// blocking. info is the opened file's fstat.
func Open(path string) (f *os.File, info fs.FileInfo, err error) {
	if _, err := Stat(path); err != nil {
		return nil, nil, err
	}
	f, err = openNonBlocking(path)
	if err != nil {
		return nil, nil, err
	}
	if info, err = f.Stat(); err == nil {
		err = Check(path, info)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, info, nil
}

// TooLargeError is a regular file larger than its reader accepts.
type TooLargeError struct{ Size, Max int64 }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("file of %d bytes is larger than the %d bytes accepted here", e.Size, e.Max)
}

// ReadAll reads a whole regular file of at most max bytes (max < 0: no
// limit but the file's size). The bytes read are exactly as many as
// fstat reported: a file that grows or shrinks while it is read is an
// error, not a longer or shorter read.
func ReadAll(path string, max int64) ([]byte, fs.FileInfo, error) {
	f, info, err := Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	b, err := ReadExactly(f, path, info.Size(), max)
	if err != nil {
		return nil, nil, err
	}
	return b, info, nil
}

// ReadExactly reads size bytes from r (a file fstat said is size bytes
// long) and checks that nothing follows them.
func ReadExactly(r io.Reader, path string, size, max int64) ([]byte, error) {
	if max >= 0 && size > max {
		return nil, &fs.PathError{Op: "read", Path: path, Err: &TooLargeError{Size: size, Max: max}}
	}
	if int64(int(size)) != size || size < 0 {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("file of %d bytes does not fit in memory", size)}
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("changed while being read (%d bytes expected): %w", size, err)}
	}
	var one [1]byte
	if n, _ := r.Read(one[:]); n != 0 {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("changed while being read (grew past %d bytes)", size)}
	}
	return b, nil
}
