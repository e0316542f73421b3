package emu

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// LockCacheEntry takes an exclusive lock on one cache directory, so that
// processes (go test runs packages in parallel) and goroutines building the
// same library wait for the first build instead of each running the
// compiler: the loser then finds the library and reuses it. The lock is
// flock(2) on a file of the entry: the kernel drops it when its holder
// exits, so a killed build never leaves the entry locked, and the wait is
// bounded by one compile. The returned function releases it.
func LockCacheEntry(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cache: locking %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
