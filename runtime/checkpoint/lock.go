package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Lock is the one right to write a checkpoint path. Two trainers writing
// one file would each replace the other's checkpoints (and one would
// delete the other's temporary file at start): a trainer takes the lock
// before any work and holds it until it exits. The lock file,
// .NAME.lock next to the checkpoint, names its owner (pid, host, start,
// what), so that the second writer's error says who the first is.
type Lock struct {
	f    *os.File
	path string // the lock file
}

// lockPath is the lock file of checkpoint path.
func lockPath(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".lock")
}

// ownerLine describes this process for the lock file.
func ownerLine(owner string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("pid %d on host %s since %s: %s\n", os.Getpid(), host, time.Now().Format(time.RFC3339), owner)
}

// readOwner returns the owner line a lock file holds (bounded: it is one
// line this package wrote).
func readOwner(f *os.File) string {
	b, _ := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, 4096), 4096))
	if len(b) == 0 {
		return "another process (its lock file names none yet)"
	}
	return string(trimNewline(b))
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// folderError says why no file can be made next to path: a missing
// folder, or one this process cannot write.
func folderError(path string, err error) error {
	dir := filepath.Dir(path)
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: the folder %s does not exist", path, dir)
	}
	return fmt.Errorf("%s: cannot write in the folder %s: %v", path, dir, err)
}
