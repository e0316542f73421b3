package native

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/cnnc/cnnc/runtime/emu"
)

// Compiling a library when the program runs (tests, tools; trainers carry theirs built in).

// CompileError is a failed compilation: Output is the compiler's message, which names File and
// the line of each error.
type CompileError struct {
	File   string
	Output string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("native: compiling %s failed:\n%s", e.File, strings.TrimSpace(e.Output))
}

func cacheDir(opts Options) string {
	if opts.CacheDir != "" {
		return opts.CacheDir
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cnnc", "native")
	}
	return filepath.Join(os.TempDir(), "cnnc-native-cache")
}

// sourceName makes the caller's name a safe file name ending in .cc.
func sourceName(name string) string {
	name = strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, filepath.Base(name))
	if name == "" || name == "." || name == ".." {
		name = "kernels"
	}
	if !strings.HasSuffix(name, ".cc") {
		name += ".cc"
	}
	return name
}

// build compiles a model's kernel source into a shared library in the cache and returns its
// path. The directory is named by a hash of the compiler, the header, the source and the flags,
// so an existing library is reused as it is (concurrent builds of one library wait on its
// lock, emu.LockCacheEntry, and one compiles it); files are written under temporary names and
// renamed, so concurrent processes never see half-written files.
func build(src []byte, name string, opts Options) (string, error) {
	cxx := opts.Compiler
	if cxx == "" {
		cxx = "g++"
	}
	id, err := emu.CompilerID(cxx)
	if err != nil {
		return "", fmt.Errorf("native: %w", err)
	}
	name = sourceName(name)
	base := strings.TrimSuffix(name, ".cc")
	srcFile := base + ".kernels.h"
	tus, err := translationUnits(src, srcFile, "")
	if err != nil {
		return "", err
	}
	flags := append([]string{"-fPIC"}, CXXFlags...)
	if asanEnabled {
		flags = asanFlags(flags)
	}
	files := []string{"cnnc_cpu.h", srcFile}
	texts := map[string]string{"cnnc_cpu.h": header, srcFile: string(src)}
	var units []string
	for f, text := range tus {
		units = append(units, f)
		texts[f] = text
	}
	sort.Strings(units)
	h := sha256.New()
	for _, part := range append([]string{id, strings.Join(flags, " ")}, files...) {
		fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	for _, f := range append(files, units...) {
		fmt.Fprintf(h, "%d:%s\n%d:%s\n", len(f), f, len(texts[f]), texts[f])
	}
	dir := filepath.Join(cacheDir(opts), hex.EncodeToString(h.Sum(nil))[:32])
	lib := filepath.Join(dir, base+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("native: cache: %w", err)
	}
	unlock, err := emu.LockCacheEntry(dir)
	if err != nil {
		return "", fmt.Errorf("native: %w", err)
	}
	defer unlock()
	if _, err := os.Stat(lib); err == nil {
		return lib, nil // built while this one waited for the lock
	}
	for f, text := range texts {
		if err := writeAtomic(filepath.Join(dir, f), text); err != nil {
			return "", err
		}
	}
	// each translation unit on its own compiler process (they take about the same time), then
	// the link; objects get names of this process so concurrent builds do not collide
	suffix := ".tmp" + randomSuffix()
	objs := make([]string, len(units))
	errs := make([]error, len(units))
	var wg sync.WaitGroup
	for i, u := range units {
		objs[i] = filepath.Join(dir, strings.TrimSuffix(u, ".cc")+suffix+".o")
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = runCompiler(cxx, dir, append(append([]string{"-x", "c++", "-c"}, flags...), "-I", dir, "-o", objs[i], filepath.Join(dir, u)), filepath.Join(dir, u))
		}()
	}
	wg.Wait()
	defer func() {
		for _, o := range objs {
			os.Remove(o)
		}
	}()
	for _, err := range errs {
		if err != nil {
			return "", err
		}
	}
	tmp := lib + suffix
	if err := runCompiler(cxx, dir, append(append(append([]string{"-shared"}, flags...), "-o", tmp), objs...), lib); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, lib); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("native: cache: %w", err)
	}
	return lib, nil
}

// asanFlags are flags (CXXFlags and more) for a library of a program built with -asan, whose
// accesses are then checked too: AddressSanitizer, line tables for its reports (-g1), and -O1 for
// -O3. GCC's -O3 over the instrumented kernels — register tiles unrolled and inlined
// (CNNC_UNROLL, CNNC_INLINE), every access checked — took over ten minutes for one translation
// unit of codegen/cpu's kernel tests, against about half a minute without ASan; at -O1 the
// kernels keep their vector code (GCC's vector types, not the auto-vectoriser) and their
// accesses, which is what ASan checks, and compile in about a minute (BENCHMARKS.md).
func asanFlags(flags []string) []string {
	out := make([]string, 0, len(flags)+4)
	for _, f := range flags {
		switch f {
		case "-O3":
			f = "-O1"
		case "-g0":
			f = "-g1"
		}
		out = append(out, f)
	}
	return append(out, "-fsanitize=address", "-fno-omit-frame-pointer")
}

// runCompiler runs the C++ compiler; a failure is a *CompileError about file.
func runCompiler(cxx, dir string, args []string, file string) error {
	cmd := exec.Command(cxx, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return &CompileError{File: file, Output: out.String()}
		}
		return fmt.Errorf("native: running %s: %w", cxx, err)
	}
	return nil
}

func writeAtomic(path, content string) error {
	tmp := path + ".tmp" + randomSuffix()
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return fmt.Errorf("native: cache: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("native: cache: %w", err)
	}
	return nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
}
