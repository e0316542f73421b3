// Package fakecuda builds a stand-in for the CUDA driver library, libcuda.so.1, that runs
// cnnc's kernels on the CPU emulator (runtime/emu), and feeds it kernels.
//
// In: a directory to build the fake into; later, each module image (fatbin) cnnc compiles,
// with the CUDA C it was compiled from. Out: dir/libcuda.so.1, and dir/modules/<key>.so, the
// emulator library of each registered image.
//
// Why: the CUDA backend (runtime/cuda, gorgonia.org/cu and the graph/pinned-memory shim) is
// host code — contexts on a locked thread, module loading, the 8-byte kernel-parameter ABI,
// dynamic shared memory limits, stream capture and graph replay, events, memory checks — and
// none of it can run where there is no GPU: cu's package init exits. Run a -tags cuda binary
// with LD_LIBRARY_PATH=dir and CNNC_FAKECUDA=dir (Environ) and it starts, loads its embedded
// fatbin, and runs every kernel on the CPU, through the same driver calls it makes on a GPU.
// The fake keeps the driver's rules where they catch host-code bugs (see csrc/libcuda.c):
// captured launches keep their parameter values, a capture fails on a synchronisation or an
// allocation, calls need a current context, more than 48 KiB of dynamic shared memory needs
// the function's attribute raised, a kernel fault is sticky. What it cannot show is the GPU
// itself: timing, occupancy, real faults of wild pointers (they crash the process instead),
// and the nvcc-compiled code (it runs the same source compiled by g++).
//
// Registration is automatic: with CNNC_FAKECUDA set, codegen/trainergen.CompileFatbin
// registers every fatbin it compiles, so `cnnc build --target cuda` under the fake produces
// a trainer that runs under it.
package fakecuda

import (
	"embed"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cnnc/cnnc/runtime/emu"
)

// Env names the fake's directory; set (with LD_LIBRARY_PATH) in the environment of a process
// that should run under the fake.
const Env = "CNNC_FAKECUDA"

// TraceEnv names a file to which the fake appends the name of every driver call a process
// makes, one per line, as it is made (csrc/trace.c).
const TraceEnv = "CNNC_FAKECUDA_TRACE"

// MemoryEnv sets the fake device's total memory in bytes (default 16 GiB).
const MemoryEnv = "CNNC_FAKECUDA_MEMORY"

// DevicesEnv sets how many devices the fake driver has (default 1): ordinals 0..n-1, alike,
// for a process per device as data-parallel ranks (LOCAL_RANK) use them.
const DevicesEnv = "CNNC_FAKECUDA_DEVICES"

// LibName is the file the dynamic loader looks for.
const LibName = "libcuda.so.1"

//go:embed csrc/libcuda.c csrc/stubs.c csrc/trace.c
var sources embed.FS

// Dir returns $CNNC_FAKECUDA: the fake's directory when this process runs under it, or "".
func Dir() string { return os.Getenv(Env) }

// Build compiles the fake driver into dir/libcuda.so.1 with gcc (cuda.h from the CUDA
// toolkit is needed: `make cuda-toolkit`) and creates dir/modules.
func Build(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "modules"), 0o755); err != nil {
		return err
	}
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	var files []string
	err = fs.WalkDir(sources, "csrc", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := sources.ReadFile(path)
		if err != nil {
			return err
		}
		f := filepath.Join(src, filepath.Base(path))
		files = append(files, f)
		return os.WriteFile(f, b, 0o644)
	})
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, LibName+".tmp")
	// -finstrument-functions: every call into the fake can be traced (csrc/trace.c)
	args := append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-finstrument-functions",
		"-I/usr/local/cuda/include", "-Wl,-soname," + LibName, "-o", tmp}, files...)
	args = append(args, "-ldl", "-lpthread")
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("fakecuda: building %s: %v\n%s", LibName, err, out)
	}
	return os.Rename(tmp, filepath.Join(dir, LibName))
}

// Environ returns base with the fake in dir in use: CNNC_FAKECUDA=dir and dir first on
// LD_LIBRARY_PATH.
func Environ(dir string, base []string) []string {
	var env []string
	ld := dir
	for _, kv := range base {
		switch {
		case strings.HasPrefix(kv, Env+"="):
		case strings.HasPrefix(kv, "LD_LIBRARY_PATH="):
			if old := strings.TrimPrefix(kv, "LD_LIBRARY_PATH="); old != "" {
				ld += ":" + old
			}
		default:
			env = append(env, kv)
		}
	}
	return append(env, Env+"="+dir, "LD_LIBRARY_PATH="+ld)
}

// ImageKey names a module image as the fake driver does: the FNV-1a 64 hash of a fatbin
// (header and payload, as its header sizes them) or of PTX text (up to its NUL).
func ImageKey(image []byte) (string, error) {
	n := len(image)
	switch {
	case len(image) >= 16 && binary.LittleEndian.Uint32(image) == 0xBA55ED50:
		size := uint64(binary.LittleEndian.Uint16(image[6:])) + binary.LittleEndian.Uint64(image[8:])
		if size > uint64(len(image)) {
			return "", fmt.Errorf("fakecuda: fatbin header says %d bytes, the image has %d", size, len(image))
		}
		n = int(size)
	case len(image) >= 4 && string(image[:4]) == "\x7fELF":
		return "", fmt.Errorf("fakecuda: cubin images are not supported (use a fatbin or PTX)")
	default:
		for i, b := range image {
			if b == 0 {
				n = i
				break
			}
		}
	}
	h := fnv.New64a()
	h.Write(image[:n])
	return fmt.Sprintf("%016x", h.Sum64()), nil
}

// Register compiles src, the CUDA C that image was compiled from, for the CPU emulator and
// records it in dir as image's kernels.
func Register(dir string, image, src []byte) error {
	key, err := ImageKey(image)
	if err != nil {
		return err
	}
	lib, err := emu.Build(src, "kernels.cu", emu.Options{})
	if err != nil {
		return fmt.Errorf("fakecuda: compiling the kernels for the emulator: %w", err)
	}
	b, err := os.ReadFile(lib)
	if err != nil {
		return err
	}
	mods := filepath.Join(dir, "modules")
	if err := os.MkdirAll(mods, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(mods, key+".so")
	tmp, err := os.CreateTemp(mods, key+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
