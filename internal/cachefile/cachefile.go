// Package cachefile writes the entries of cnnc's on-disk caches (nvcc's
// outputs, the performance model's ptxas reports and traces).
//
// In: a path and its bytes. Out: the file, or nothing.
// Why: an entry is written under a temporary name and renamed, so a
// concurrent reader (go test runs packages in parallel) never sees half a
// file; and a cache that cannot be written is only slower next time, so a
// failure is not an error.
package cachefile

import (
	"os"
	"path/filepath"
)

// Write stores data at path atomically, creating its folder; it reports
// whether it did.
func Write(path string, data []byte) bool {
	dir := filepath.Dir(path)
	if os.MkdirAll(dir, 0o755) != nil {
		return false
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return false
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
		return false
	}
	return true
}
