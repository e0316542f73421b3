package perf

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/internal/cachefile"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// KernelResources is what ptxas and the SASS say about one kernel built for
// one architecture.
type KernelResources struct {
	Registers    int    // per thread
	StaticShared int    // bytes (the launch adds its dynamic shared memory)
	HMMA         int    // tensor-core instructions in its SASS
	TensorKind   string // "tf32", "bf16" (the HMMA forms found), or ""
	Instructions int    // SASS instructions (static count)
	Spills       bool
}

// Resources compiles source for arch with nvcc (-Xptxas -v) and reads the
// cubin's SASS with cuobjdump: registers, static shared memory, spills, and
// whether each kernel runs on tensor cores (HMMA). Results are cached by
// nvcc's version, the architecture and the source, in CacheDir.
func Resources(source []byte, arch string) (map[string]KernelResources, error) {
	version, err := nvccVersion()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(version + "\x00" + arch + "\x00" + string(source)))
	cache := filepath.Join(CacheDir(), "sass-"+hex.EncodeToString(sum[:16])+".json")
	if data, err := os.ReadFile(cache); err == nil {
		var out map[string]KernelResources
		if json.Unmarshal(data, &out) == nil {
			return out, nil
		}
	}
	out, err := compileResources(source, arch)
	if err != nil {
		return nil, err
	}
	if data, err := json.Marshal(out); err == nil {
		cachefile.Write(cache, data)
	}
	return out, nil
}

func compileResources(source []byte, arch string) (map[string]KernelResources, error) {
	dir, err := os.MkdirTemp("", "cnnc-perf")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, cubin := filepath.Join(dir, "kernels.cu"), filepath.Join(dir, "kernels.cubin")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return nil, err
	}
	report, err := nvcc.Run("-cubin", "-arch="+arch, "-Xptxas", "-v", "-o", cubin, src)
	if err != nil {
		return nil, err
	}
	ks, err := codegen.ParsePtxas(bytes.NewReader(report))
	if err != nil {
		return nil, err
	}
	sass, err := cuobjdump(cubin)
	if err != nil {
		return nil, err
	}
	fns := SplitSASS(sass)
	out := map[string]KernelResources{}
	for _, k := range ks {
		text := fns[k.Name]
		r := KernelResources{Registers: k.Registers, StaticShared: k.SharedBytes, Spills: !k.Clean(),
			HMMA: strings.Count(text, "HMMA."), Instructions: countInstructions(text)}
		switch {
		case strings.Contains(text, ".BF16"):
			r.TensorKind = "bf16"
		case strings.Contains(text, ".TF32"):
			r.TensorKind = "tf32"
		}
		out[k.Name] = r
	}
	return out, nil
}

// cuobjdump runs `cuobjdump -sass` (found next to nvcc, else on PATH).
func cuobjdump(cubin string) (string, error) {
	tool := "cuobjdump"
	if p, err := nvcc.Path(); err == nil {
		if c := filepath.Join(filepath.Dir(p), "cuobjdump"); fileExists(c) {
			tool = c
		}
	}
	out, err := exec.Command(tool, "-sass", cubin).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("cuobjdump -sass: %v\n%s", err, out)
	}
	return string(out), nil
}

// SplitSASS maps each function of a `cuobjdump -sass` listing to its text.
func SplitSASS(sass string) map[string]string {
	out := map[string]string{}
	cur := ""
	for _, line := range strings.Split(sass, "\n") {
		if i := strings.Index(line, "Function : "); i >= 0 {
			cur = strings.TrimSpace(line[i+len("Function : "):])
			continue
		}
		if cur != "" {
			out[cur] += line + "\n"
		}
	}
	return out
}

// countInstructions counts the SASS instruction lines ("/*0a40*/ OP ...;").
func countInstructions(text string) int {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "/*") && strings.HasSuffix(l, ";") && !strings.Contains(l, " NOP") {
			n++
		}
	}
	return n
}

var nvccVersionOnce struct {
	sync.Once
	v   string
	err error
}

func nvccVersion() (string, error) {
	nvccVersionOnce.Do(func() {
		out, err := nvcc.Run("--version")
		nvccVersionOnce.v, nvccVersionOnce.err = strings.TrimSpace(string(out)), err
	})
	return nvccVersionOnce.v, nvccVersionOnce.err
}

// CacheDir holds the model's cached compilations and traces:
// $CNNC_PERF_CACHE, else os.UserCacheDir()/cnnc/perf.
func CacheDir() string {
	if d := os.Getenv("CNNC_PERF_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cnnc", "perf")
	}
	return filepath.Join(os.TempDir(), "cnnc-perf-cache")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
