//go:build !unix

package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Acquire takes the lock of checkpoint path for owner by creating its
// lock file exclusively. Without flock(2) a lock left by a killed process
// stays: the error then names the file to remove.
func Acquire(path, owner string) (*Lock, error) {
	lp := lockPath(path)
	f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		holder := "another process"
		if g, err := os.Open(lp); err == nil {
			holder = readOwner(g)
			g.Close()
		}
		return nil, fmt.Errorf("%s is being written by %s (if that process is gone, remove %s)", path, holder, lp)
	}
	if err != nil {
		return nil, folderError(path, err)
	}
	if _, err := f.WriteString(ownerLine(owner)); err != nil {
		f.Close()
		os.Remove(lp)
		return nil, fmt.Errorf("%s: %w", lp, err)
	}
	return &Lock{f: f, path: lp}, nil
}

// Release gives up the lock and removes its file.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	if rerr := os.Remove(l.path); err == nil {
		err = rerr
	}
	l.f = nil
	return err
}
