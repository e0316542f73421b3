//go:build unix

package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Acquire takes the lock of checkpoint path for owner (e.g. "a trainer of
// model X"), with flock(2) on the lock file: the kernel releases it when
// its holder exits, however it exits, so a killed writer never blocks the
// next one, and whoever holds it knows that no live process writes path
// (its temporary files are leftovers: RemoveStaleTemps). It fails naming
// the folder when it is missing or not writable, and naming the holder
// when another process has the lock.
func Acquire(path, owner string) (*Lock, error) {
	lp := lockPath(path)
	// the holder removes the file when it releases it: a lock taken on a
	// removed file guards nothing, so take it again on the new one
	for range 100 {
		f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, folderError(path, err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			holder := readOwner(f)
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%s is being written by %s; stop that process or choose another checkpoint file", path, holder)
			}
			return nil, fmt.Errorf("%s: locking %s: %w", path, lp, err)
		}
		if sameFile(f, lp) {
			if err := f.Truncate(0); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", lp, err)
			}
			if _, err := f.WriteAt([]byte(ownerLine(owner)), 0); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", lp, err)
			}
			return &Lock{f: f, path: lp}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("%s: %s keeps being replaced: another process is taking and releasing it", path, lp)
}

// sameFile says whether the open file f is still the file at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// Release removes the lock file and gives up the lock (removed first, so
// that a process that opened it meanwhile sees it is gone and retries).
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := os.Remove(l.path)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
