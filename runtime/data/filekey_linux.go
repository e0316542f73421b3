package data

import (
	"io/fs"
	"syscall"
)

const keyHasCtime = true

func changeTimeAndInode(info fs.FileInfo) (int64, uint64) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0
	}
	return st.Ctim.Sec*1e9 + st.Ctim.Nsec, st.Ino
}

// freeBytes is the space an unprivileged user may still use in dir.
func freeBytes(dir string) (int64, bool) {
	var s syscall.Statfs_t
	if syscall.Statfs(dir, &s) != nil {
		return 0, false
	}
	return int64(s.Bavail) * s.Bsize, true
}
