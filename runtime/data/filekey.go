package data

import (
	"io/fs"
	"time"
)

// fileKey is what stat says about a file's identity: the image cache
// trusts a record whose key equals the file's (no read, no hash). Size and
// mtime alone do not identify content: `cp -p` and `rsync -a` keep them
// when they replace a file. The change time cannot be set by any copy
// tool — every write, chmod or rename sets it to the current time — and
// the inode number changes when a file is replaced by a rename (rsync).
// Where the platform gives no change time (keyHasCtime false), no record
// is trusted by its key: every file is hashed on every open.
type fileKey struct {
	size  int64
	mtime int64 // Unix nanoseconds
	ctime int64 // Unix nanoseconds; 0 where unknown
	ino   uint64
}

func keyOf(info fs.FileInfo) fileKey {
	k := fileKey{size: info.Size(), mtime: info.ModTime().UnixNano()}
	k.ctime, k.ino = changeTimeAndInode(info)
	return k
}

// racyWindow: a file changed within this long of the moment its key was
// taken may change again with the same change time (timestamps are
// coarse: a kernel tick, 1 s on some file systems, 2 s on FAT), so a
// record whose change time falls within racyWindow of the scan that made
// it is not trusted by its key (git's "racily clean" entries).
const racyWindow = 2 * time.Second
