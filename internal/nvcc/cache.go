package nvcc

// Compile's cache: nvcc is a pure function of its version, its flags and
// the source, and the slowest step of every build and test that compiles
// generated kernels for the GPU (tens of CPU seconds for a large .cu file),
// so its report and output file are kept by a hash of those, as the
// emulator and the CPU target keep their compiled libraries. Only
// successful compiles are kept: a failure is compiled (and reported) again.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cnnc/cnnc/internal/cachefile"
)

// CacheEnv names the cache folder; "off" compiles every time. Default:
// os.UserCacheDir()/cnnc/nvcc.
const CacheEnv = "CNNC_NVCC_CACHE"

// Compile writes source as name into a temporary folder, runs nvcc args...
// -o OUT on it, and returns nvcc's output (ptxas's report, with -Xptxas -v)
// and the file OUT it wrote (outName is its name), from the cache when the
// same nvcc compiled the same source with the same flags before.
func Compile(source []byte, name string, args []string, outName string) (report, output []byte, err error) {
	key, err := cacheKey(source, name, args, outName)
	if err != nil {
		return nil, nil, err
	}
	dir := cacheDir()
	if dir != "" {
		if r, o, ok := readCached(dir, key); ok {
			return r, o, nil
		}
	}
	tmp, err := os.MkdirTemp("", "cnnc-nvcc-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	src, out := filepath.Join(tmp, name), filepath.Join(tmp, outName)
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return nil, nil, err
	}
	report, err = Run(append(append(append([]string{}, args...), "-o", out), src)...)
	if err != nil {
		return report, nil, err
	}
	if output, err = os.ReadFile(out); err != nil {
		return nil, nil, fmt.Errorf("nvcc wrote no %s: %w", outName, err)
	}
	if dir != "" {
		writeCached(dir, key, report, output)
	}
	return report, output, nil
}

var version struct {
	sync.Once
	v   string
	err error
}

// identity is nvcc's path and `nvcc --version`: a new toolkit is a new key.
func identity() (string, error) {
	version.Do(func() {
		p, err := Path()
		if err != nil {
			version.err = err
			return
		}
		out, err := Run("--version")
		version.v, version.err = p+"\n"+strings.TrimSpace(string(out)), err
	})
	return version.v, version.err
}

// cacheKey hashes nvcc's identity, the names, the flags and the source —
// without the text of a first line that is a line comment: generated
// sources name their model's path there, which changes no code, so the
// same model compiles once in every checkout. (A comment line ending in a
// backslash continues onto the next line, and is kept.)
func cacheKey(source []byte, name string, args []string, outName string) (string, error) {
	id, err := identity()
	if err != nil {
		return "", err
	}
	code := string(source)
	if first, rest, ok := strings.Cut(code, "\n"); ok && strings.HasPrefix(first, "//") && !strings.HasSuffix(first, "\\") {
		code = "//\n" + rest
	}
	h := sha256.New()
	for _, part := range append([]string{"cnnc nvcc cache 1", id, name, outName, code}, args...) {
		binary.Write(h, binary.LittleEndian, uint64(len(part)))
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func cacheDir() string {
	if d := os.Getenv(CacheEnv); d != "" {
		if d == "off" {
			return ""
		}
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cnnc", "nvcc")
	}
	return filepath.Join(os.TempDir(), "cnnc-nvcc-cache")
}

// An entry is KEY.report and KEY.out; KEY.out is renamed into place last,
// so an entry with it is whole.
func readCached(dir, key string) (report, output []byte, ok bool) {
	output, err := os.ReadFile(filepath.Join(dir, key+".out"))
	if err != nil {
		return nil, nil, false
	}
	report, err = os.ReadFile(filepath.Join(dir, key+".report"))
	if err != nil {
		return nil, nil, false
	}
	return report, output, true
}

// writeCached stores an entry (report and output); a cache that cannot be
// written is only slower next time.
func writeCached(dir, key string, report, output []byte) {
	if cachefile.Write(filepath.Join(dir, key+".report"), report) {
		cachefile.Write(filepath.Join(dir, key+".out"), output)
	}
}
