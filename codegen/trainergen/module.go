package trainergen

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cnnc/cnnc"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/version"
)

// runtimeDir is where a trainer module keeps its copy of cnnc's runtime.
const runtimeDir = "cnnc-runtime"

// WriteModule writes a standalone Go module for a trainer into dir: the
// generated main.go and spec.go, the kernels, and a copy of cnnc's runtime
// (from the cnnc binary itself) that go.mod points at with a replace
// directive, so the module builds anywhere.
func WriteModule(dir string, spec *trainer.Spec, kernels []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	specSrc, err := SpecFile("main", spec)
	if err != nil {
		return err
	}
	mainSrc, err := MainFile(spec)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"spec.go":    specSrc,
		"main.go":    mainSrc,
		"kernels.cu": kernels,
		"go.mod": []byte(fmt.Sprintf(`// %s
module %s

go 1.26

require github.com/cnnc/cnnc v0.0.0

replace github.com/cnnc/cnnc => ./%s
`, header(spec.Source), modulePath(spec), runtimeDir)),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	// the runtime's source, and cnnc's go.sum as the trainer's starting point
	rt := filepath.Join(dir, runtimeDir)
	if err := os.RemoveAll(rt); err != nil {
		return err
	}
	err = fs.WalkDir(cnnc.RuntimeSource, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(rt, path)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if strings.HasSuffix(path, "_test.go") || strings.Contains(path, "/testdata/") {
			return nil
		}
		b, err := cnnc.RuntimeSource.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		return fmt.Errorf("writing the runtime's source: %v", err)
	}
	sum, err := cnnc.RuntimeSource.ReadFile("go.sum")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644)
}

// GoBuild resolves the module's dependencies (through the Go module proxy
// or the local module cache) and builds the trainer binary to output.
// tags are build tags ("cuda" for the GPU backend).
func GoBuild(dir, output string, tags []string, log func(string)) error {
	abs, err := filepath.Abs(output)
	if err != nil {
		return err
	}
	run := func(args ...string) error {
		log("go " + strings.Join(args, " "))
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
		}
		return nil
	}
	if err := run("mod", "tidy"); err != nil {
		return err
	}
	// -s -w: no symbol table or DWARF, a third smaller (bundles travel);
	// -X: the trainer reports (--version, checkpoints) this cnnc's version
	args := []string{"build", "-trimpath", "-ldflags=-s -w " + version.LDFlags(), "-o", abs}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	return run(append(args, ".")...)
}
