package native

import (
	"bufio"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

//go:embed cnnc_cpu.h
var header string

// Header returns the text of cnnc_cpu.h, the kernel library every model's kernels are compiled
// with (a trainer module carries a copy).
func Header() string { return header }

// kernelDecl is a CNNC_CPU_KERNEL line of a model's kernel source.
type kernelDecl struct {
	name    string
	nparams int
}

// kernelPrefix starts the line that declares a kernel in a model's kernel source (codegen/cpu
// writes one per kernel): CNNC_CPU_KERNEL(name, nparams, Implementation<...>).
const kernelPrefix = "CNNC_CPU_KERNEL("

// findKernels lists the kernels a model's source declares, in order.
func findKernels(src string) ([]kernelDecl, error) {
	var out []kernelDecl
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for line := 1; sc.Scan(); line++ {
		t := sc.Text()
		if !strings.HasPrefix(t, kernelPrefix) {
			continue
		}
		parts := strings.SplitN(strings.TrimPrefix(t, kernelPrefix), ",", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("native: line %d: a kernel declaration needs a name, a parameter count and an implementation", line)
		}
		name := strings.TrimSpace(parts[0])
		n, err := strconv.Atoi(strings.TrimSpace(parts[1]))
		if !isIdent(name) || err != nil || n < 0 {
			return nil, fmt.Errorf("native: line %d: bad kernel declaration %q", line, t)
		}
		if seen[name] {
			return nil, fmt.Errorf("native: line %d: kernel %s declared twice", line, name)
		}
		seen[name] = true
		out = append(out, kernelDecl{name, n})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("native: no kernel declared (%s...) in the source", kernelPrefix)
	}
	return out, nil
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r != '_' && !(r >= 'a' && r <= 'z') && !(r >= 'A' && r <= 'Z') && !(i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// sourceSHA is the hex SHA-256 of a model's kernel source: what a built-in library is found by.
func sourceSHA(src []byte) string {
	h := sha256.Sum256(src)
	return hex.EncodeToString(h[:])
}

// isas are the instruction sets every library is compiled for: index 0 the baseline every
// x86-64 has (SSE2, 4 floats a vector), index 1 AVX2 with FMA (8 floats), chosen at run time.
var isas = [2]struct {
	suffix, pragma string
	width          int
}{
	{"sse2", "", 4},
	{"avx2", "avx2,fma", 8},
}

// sharedEntry is the entry function of a library compiled at run time (a shared library).
const sharedEntry = "cnnc_cpu_library_entry"

// translationUnits are what compiles a model's kernel source src, which lies next to them as
// srcFile: one file per instruction set, which includes the source inside its own namespace
// (named by the hash of header and source, so several libraries can share a program) and exports
// its kernels' implementations, and one with the names, the parameter counts and the entry
// function — builtin names a built-in library's (weak and hidden, looked up through
// RegisterBuiltin), else the shared library's sharedEntry. Separate files compile in parallel.
// The result maps file names (srcFile's base, then _sse2.cc, _avx2.cc, _table.cc) to their text.
func translationUnits(src []byte, srcFile, builtin string) (map[string]string, error) {
	decls, err := findKernels(string(src))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", srcFile, err)
	}
	id := libraryID(src)
	base := strings.TrimSuffix(srcFile, filepath.Ext(srcFile))
	out := map[string]string{}
	for _, isa := range isas {
		var b strings.Builder
		fmt.Fprintf(&b, "// The CPU target's kernels of %s for %s (runtime/native).\n#include \"cnnc_cpu.h\"\n", srcFile, isa.suffix)
		if isa.pragma != "" {
			fmt.Fprintf(&b, "#pragma GCC target(\"%s\")\n", isa.pragma)
		}
		ns := fmt.Sprintf("cnnc_cpu_%s_%s", id, isa.suffix)
		fmt.Fprintf(&b, "namespace %s {\n#define CNNC_VW %d\n#include \"cnnc_cpu.h\"\n#include \"%s\"\n#undef CNNC_VW\n}  // namespace %s\n\n", ns, isa.width, srcFile, ns)
		fmt.Fprintf(&b, "extern const cnnc_cpu_kernel_impl %s_impl[%d];\nconst cnnc_cpu_kernel_impl %s_impl[%d] = {\n", ns, len(decls), ns, len(decls))
		for _, d := range decls {
			fmt.Fprintf(&b, "    {&%s::%s::run, %s::%s::scratch, %s::%s::tasks},\n", ns, d.name, ns, d.name, ns, d.name)
		}
		b.WriteString("};\n")
		out[base+"_"+isa.suffix+".cc"] = b.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "// The kernel table of %s (runtime/native).\n#include \"cnnc_cpu.h\"\n\n", srcFile)
	for _, isa := range isas {
		fmt.Fprintf(&b, "extern const cnnc_cpu_kernel_impl cnnc_cpu_%s_%s_impl[%d];\n", id, isa.suffix, len(decls))
	}
	fmt.Fprintf(&b, "namespace cnnc_cpu_%s_table {\nconst char* const names[] = {\n", id)
	for _, d := range decls {
		fmt.Fprintf(&b, "    \"%s\",\n", d.name)
	}
	b.WriteString("};\nconst int32_t nparams[] = {")
	for i, d := range decls {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, d.nparams)
	}
	fmt.Fprintf(&b, "};\nconst cnnc_cpu_library library = {CNNC_CPU_ABI, \"%s\", %d, names, nparams, {cnnc_cpu_%s_sse2_impl, cnnc_cpu_%s_avx2_impl}};\n}  // namespace cnnc_cpu_%s_table\n\n",
		sourceSHA(src), len(decls), id, id, id)
	if builtin != "" {
		fmt.Fprintf(&b, "extern \"C\" __attribute__((weak, visibility(\"hidden\"))) const cnnc_cpu_library* %s(void) {\n", builtin)
	} else {
		fmt.Fprintf(&b, "extern \"C\" __attribute__((visibility(\"default\"))) const cnnc_cpu_library* %s(void) {\n", sharedEntry)
	}
	fmt.Fprintf(&b, "  return &cnnc_cpu_%s_table::library;\n}\n", id)
	out[base+"_table.cc"] = b.String()
	return out, nil
}

// libraryID names a library's namespaces and built-in entry: 8 bytes of the hash of the header
// and the source.
func libraryID(src []byte) string {
	h := sha256.Sum256([]byte(header + "\x00" + string(src)))
	return hex.EncodeToString(h[:8])
}

// CXXFlags are the flags every kernel library is compiled with: C++20 in GNU mode, whose
// floating-point contraction is on (the AVX2 table's multiply-adds become FMAs), optimised, no
// debug information (trainers are stripped; it costs a third of the compile time). They are the
// flags of a trainer's `#cgo CXXFLAGS:` line too, so each must be one go build allows there
// (-ffp-contract=fast and -fno-math-errno are not).
var CXXFlags = []string{"-std=gnu++20", "-O3", "-g0", "-fvisibility=hidden"}

// Builtin is a model's kernel source prepared for compiling into a program by go build (cgo).
type Builtin struct {
	// Sources are the C++ translation units by file name: write them, with Header() as
	// cnnc_cpu.h and the model's kernel source as the file BuiltinSource was given, into the Go
	// package that registers them.
	Sources map[string]string
	// Entry is the entry function `const cnnc_cpu_library* Entry(void)`: the package declares it
	// in its cgo preamble and calls RegisterBuiltin(unsafe.Pointer(C.Entry)) at init.
	Entry string
}

// BuiltinSource prepares a model's kernel source, kept next to the translation units as srcFile
// (a name cgo does not compile on its own, e.g. kernels_cpu.h), for compiling into a program.
func BuiltinSource(src []byte, srcFile string) (*Builtin, error) {
	entry := "cnnc_cpu_builtin_" + libraryID(src)
	tus, err := translationUnits(src, srcFile, entry)
	if err != nil {
		return nil, err
	}
	return &Builtin{Sources: tus, Entry: entry}, nil
}

// GoFile renders the Go file of package pkg that compiles the built-in library (its cgo flags)
// and registers it at init; comment is its first comment line(s), already safe in a comment.
func (b *Builtin) GoFile(pkg string, comment ...string) string {
	var s strings.Builder
	for _, line := range comment {
		fmt.Fprintf(&s, "// %s\n", line)
	}
	fmt.Fprintf(&s, "\npackage %s\n\n", pkg)
	fmt.Fprintf(&s, "// #cgo CXXFLAGS: %s\n// #include <stdint.h>\n// const void* %s(void);\nimport \"C\"\n\n", strings.Join(CXXFlags, " "), b.Entry)
	s.WriteString("import (\n\t\"unsafe\"\n\n\t\"github.com/cnnc/cnnc/runtime/native\"\n)\n\n")
	s.WriteString("// The CPU target's kernels compiled into the program: the device runs them without a compiler.\n")
	fmt.Fprintf(&s, "func init() { native.RegisterBuiltin(unsafe.Pointer(C.%s)) }\n", b.Entry)
	return s.String()
}

var builtins sync.Map // hex SHA-256 of the source -> entry function

// RegisterBuiltin makes a library compiled into the program (see BuiltinSource) available to
// New: entry is its entry function. Programs call it at init.
func RegisterBuiltin(entry unsafe.Pointer) {
	info := readLibrary(entry)
	if info.abi != abiVersion {
		return // a library of another cnnc: New compiles the source as usual
	}
	builtins.Store(info.sha256, entry)
}

// abiVersion is CNNC_CPU_ABI of cnnc_cpu.h.
const abiVersion = 3
