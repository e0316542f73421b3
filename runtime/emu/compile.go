package emu

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

//go:embed cuda_emu.h
var header string

// Header returns the text of cuda_emu.h, the emulation header every kernel is compiled with.
// Given to nvcc/NVRTC it only defines the cnnc macros.
func Header() string { return header }

// DynamicSharedCUDA is the real-CUDA definition of CNNC_DYNAMIC_SHARED, for kernels compiled
// without cuda_emu.h.
const DynamicSharedCUDA = "#define CNNC_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]"

// Options control how a module is compiled and run. The zero value is ready to use.
type Options struct {
	// CacheDir holds compiled modules, keyed by a hash of everything that affects the result.
	// Default: os.UserCacheDir()/cnnc/emu (or the temp dir).
	CacheDir string
	// Compiler is the C++20 compiler. Default "g++".
	Compiler string
	// Flags are extra compiler flags (e.g. "-DTILE=16").
	Flags []string
	// Debug compiles with -O0 -g and implies PoisonShared.
	Debug bool
	// PoisonShared fills dynamic shared memory with 0xFF bytes (a float NaN, an int -1) before
	// every block, to catch kernels that rely on it being zero or on a previous block's data.
	// Without it the buffer is filled once, when allocated.
	PoisonShared bool
	// Workers is the number of OS threads a launch runs blocks on. Default GOMAXPROCS.
	Workers int
}

// CompileError is a failed compilation: Output is the compiler's message, which names File
// and the line of each error.
type CompileError struct {
	File   string
	Output string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("emu: compiling %s failed:\n%s", e.File, strings.TrimSpace(e.Output))
}

// compilerIDs caches `<compiler> --version` per compiler: part of the cache key.
var compilerIDs sync.Map

// CompilerID is the first line of `cxx --version`, asked once per compiler
// and process: part of every compiled library's cache key (here and in
// runtime/native), so a changed compiler never loads another's library.
func CompilerID(cxx string) (string, error) {
	if id, ok := compilerIDs.Load(cxx); ok {
		return id.(string), nil
	}
	out, err := exec.Command(cxx, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("C++ compiler %q not usable: %w", cxx, err)
	}
	id := string(bytes.SplitN(out, []byte("\n"), 2)[0])
	compilerIDs.Store(cxx, id)
	return id, nil
}

func cacheDir(opts Options) string {
	if opts.CacheDir != "" {
		return opts.CacheDir
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cnnc", "emu")
	}
	return filepath.Join(os.TempDir(), "cnnc-emu-cache")
}

// sourceName turns the caller's name into a safe file name ending in .cu.
func sourceName(name string) string {
	name = filepath.Base(name)
	name = strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
	if name == "" || name == "." || name == ".." || name == "_" {
		name = "kernel"
	}
	if !strings.HasSuffix(name, ".cu") {
		name += ".cu"
	}
	return name
}

// build compiles source (already carrying its trampolines) into a shared library in the cache
// and returns the library's path. The directory is named by a hash of the header, the source,
// the flags and the compiler, so an existing library is reused as is. Files are written under
// temporary names and renamed, so concurrent processes never see half-written files, and
// concurrent builds of one library wait on its lock (LockCacheEntry): one compiles it.
func build(source, name string, opts Options) (string, error) {
	cxx := opts.Compiler
	if cxx == "" {
		cxx = "g++"
	}
	id, err := CompilerID(cxx)
	if err != nil {
		return "", fmt.Errorf("emu: %w", err)
	}
	flags := []string{"-x", "c++", "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden"}
	if opts.Debug {
		flags = append(flags, "-O0", "-g")
	} else {
		flags = append(flags, "-O3")
	}
	if asanEnabled {
		// Match the Go binary built with -asan: the library's accesses are checked too.
		flags = append(flags, "-g", "-fsanitize=address", "-fno-omit-frame-pointer")
	}
	flags = append(flags, opts.Flags...)

	h := sha256.New()
	for _, part := range append([]string{id, header, name, source}, flags...) {
		fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	dir := filepath.Join(cacheDir(opts), hex.EncodeToString(h.Sum(nil))[:32])
	lib := filepath.Join(dir, strings.TrimSuffix(name, ".cu")+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("emu: cache: %w", err)
	}
	unlock, err := LockCacheEntry(dir)
	if err != nil {
		return "", fmt.Errorf("emu: %w", err)
	}
	defer unlock()
	if _, err := os.Stat(lib); err == nil {
		return lib, nil // built while this one waited for the lock
	}
	hdrPath := filepath.Join(dir, "cuda_emu.h")
	srcPath := filepath.Join(dir, name)
	if err := writeAtomic(hdrPath, header); err != nil {
		return "", err
	}
	if err := writeAtomic(srcPath, source); err != nil {
		return "", err
	}
	tmp := lib + ".tmp" + randomSuffix()
	args := append(append([]string{}, flags...), "-include", hdrPath, "-o", tmp, srcPath)
	cmd := exec.Command(cxx, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return "", &CompileError{File: srcPath, Output: out.String()}
		}
		return "", fmt.Errorf("emu: running %s: %w", cxx, err)
	}
	if err := os.Rename(tmp, lib); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("emu: cache: %w", err)
	}
	return lib, nil
}

func writeAtomic(path, content string) error {
	tmp := path + ".tmp" + randomSuffix()
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return fmt.Errorf("emu: cache: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("emu: cache: %w", err)
	}
	return nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
}
