package codegen

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cnnc/cnnc/internal/nvcc"
)

// PtxasKernel is what ptxas reports about one kernel compiled for one GPU
// architecture (`nvcc -Xptxas -v`).
type PtxasKernel struct {
	Name      string
	Arch      string // sm_80, sm_90
	Registers int    // per thread
	// SharedBytes is static shared memory; dynamic shared memory is the
	// launch's (Launch.SharedBytes).
	SharedBytes int
	ConstBytes  int // cmem[0]: kernel parameters and constants
	// StackFrame is the per-thread local-memory stack frame; SpillStores
	// and SpillLoads are the bytes of register spills to it. All three
	// should be zero for generated kernels.
	StackFrame, SpillStores, SpillLoads int
	LocalBytes                          int // lmem, as older ptxas versions report it
}

// Clean reports whether the kernel neither spills nor uses a local-memory
// stack frame.
func (k PtxasKernel) Clean() bool {
	return k.StackFrame == 0 && k.SpillStores == 0 && k.SpillLoads == 0 && k.LocalBytes == 0
}

func (k PtxasKernel) String() string {
	return fmt.Sprintf("%s %s: %d registers, %d bytes smem, %d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
		k.Arch, k.Name, k.Registers, k.SharedBytes, k.StackFrame, k.SpillStores, k.SpillLoads)
}

var (
	ptxasEntry     = regexp.MustCompile(`Compiling entry function '([^']+)' for '([^']+)'`)
	ptxasFunction  = regexp.MustCompile(`Function properties for (\S+)`)
	ptxasFrame     = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasUsed      = regexp.MustCompile(`Used (\d+) registers(.*)`)
	ptxasBytesPart = regexp.MustCompile(`(\d+)(?:\+(\d+))? bytes (smem|lmem|cmem\[0\])`)
)

// ParsePtxas reads the -Xptxas -v report of one nvcc run: a block per
// kernel and architecture ("Compiling entry function 'k' for 'sm_80'",
// "Function properties for k" with its stack frame and spills, "Used N
// registers, S bytes smem, C bytes cmem[0]"), in the order compiled.
// Lines it does not know (gmem, compile times, warnings) are skipped.
// Properties of non-inlined device functions are folded into no kernel:
// the kernel calling one reports its own frame.
func ParsePtxas(r io.Reader) ([]PtxasKernel, error) {
	var out []PtxasKernel
	var cur *PtxasKernel
	props := "" // the function the next "stack frame" line describes
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if m := ptxasEntry.FindStringSubmatch(text); m != nil {
			out = append(out, PtxasKernel{Name: m[1], Arch: m[2]})
			cur = &out[len(out)-1]
			props = ""
			continue
		}
		if m := ptxasFunction.FindStringSubmatch(text); m != nil {
			props = m[1]
			continue
		}
		if m := ptxasFrame.FindStringSubmatch(text); m != nil {
			if cur == nil {
				return nil, fmt.Errorf("ptxas report line %d: function properties before any entry function: %q", line, text)
			}
			if props == cur.Name {
				cur.StackFrame, cur.SpillStores, cur.SpillLoads = atoi(m[1]), atoi(m[2]), atoi(m[3])
			}
			continue
		}
		if m := ptxasUsed.FindStringSubmatch(text); m != nil {
			if cur == nil {
				return nil, fmt.Errorf("ptxas report line %d: register usage before any entry function: %q", line, text)
			}
			cur.Registers = atoi(m[1])
			for _, p := range ptxasBytesPart.FindAllStringSubmatch(m[2], -1) {
				n := atoi(p[1]) + atoi(p[2])
				switch p[3] {
				case "smem":
					cur.SharedBytes = n
				case "lmem":
					cur.LocalBytes = n
				default:
					cur.ConstBytes = n
				}
			}
		}
	}
	return out, sc.Err()
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// CompilePtxas compiles a generated .cu source with nvcc for each
// architecture (one nvcc per architecture, in parallel) and returns
// ptxas's report, sorted by kernel then architecture. The source is
// compiled exactly as written (it carries its own CNNC_DYNAMIC_SHARED);
// nvcc.Compile keeps the reports by nvcc's version and the source.
func CompilePtxas(source []byte, name string, archs []string) ([]PtxasKernel, error) {
	name = strings.TrimSuffix(filepath.Base(name), ".cu") + ".cu"
	reports := make([][]PtxasKernel, len(archs))
	errs := make([]error, len(archs))
	var wg sync.WaitGroup
	for i, arch := range archs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _, err := nvcc.Compile(source, name, []string{"-cubin", "-arch=" + arch, "-Xptxas", "-v"}, arch+".cubin")
			if err != nil {
				errs[i] = err
				return
			}
			reports[i], errs[i] = ParsePtxas(bytes.NewReader(out))
			if errs[i] == nil && len(reports[i]) == 0 {
				errs[i] = fmt.Errorf("nvcc -arch=%s: no ptxas report in its output:\n%s", arch, out)
			}
		}()
	}
	wg.Wait()
	var all []PtxasKernel
	for i := range archs {
		if errs[i] != nil {
			return nil, errs[i]
		}
		all = append(all, reports[i]...)
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].Name != all[j].Name {
			return all[i].Name < all[j].Name
		}
		return all[i].Arch < all[j].Arch
	})
	return all, nil
}

// WritePtxasReport prints a table of kernels: registers, static and
// dynamic shared memory (from the program's launches), stack frame and
// spills per architecture.
func WritePtxasReport(w io.Writer, prog *Program, ks []PtxasKernel) {
	dynamic := map[string]int{}
	for _, l := range prog.Launches {
		dynamic[l.Kernel] = max(dynamic[l.Kernel], l.SharedBytes)
	}
	fmt.Fprintf(w, "%-6s %5s %6s %8s %6s %8s %8s  %s\n", "arch", "regs", "smem", "dyn-smem", "stack", "spill-st", "spill-ld", "kernel")
	for _, k := range ks {
		fmt.Fprintf(w, "%-6s %5d %6d %8d %6d %8d %8d  %s\n", k.Arch, k.Registers, k.SharedBytes, dynamic[k.Name], k.StackFrame, k.SpillStores, k.SpillLoads, k.Name)
	}
}

// Per-block limits of the GPU targets: a launch beyond them fails on the
// device with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES or INVALID_VALUE, which
// no CPU emulation shows, so they are checked against ptxas's report.
var blockLimits = map[string]struct {
	registers   int // the register file one block may use
	sharedBytes int // static + dynamic shared memory after opting in
}{
	"sm_80": {65536, 163 << 10}, // A100
	"sm_90": {65536, 227 << 10}, // H100, H200
}

// CheckLaunchResources checks every launch against the per-block
// limits of each architecture in ks: registers (ptxas's count per thread,
// allocated in units of 8 per thread and whole warps) times threads, and
// static plus dynamic shared memory. It returns one error per launch and
// architecture that would not start.
func CheckLaunchResources(launches []*Launch, ks []PtxasKernel) []error {
	var errs []error
	byKernel := map[string][]PtxasKernel{}
	for _, k := range ks {
		byKernel[k.Name] = append(byKernel[k.Name], k)
	}
	seen := map[string]bool{}
	for _, l := range launches {
		threads := int(l.Block[0] * l.Block[1] * l.Block[2])
		for _, k := range byKernel[l.Kernel] {
			lim, ok := blockLimits[k.Arch]
			if !ok {
				continue
			}
			key := fmt.Sprintf("%s/%s/%d/%d", k.Arch, l.Kernel, threads, l.SharedBytes)
			if seen[key] {
				continue
			}
			seen[key] = true
			regs := (k.Registers + 7) / 8 * 8 * ((threads + 31) / 32 * 32)
			if regs > lim.registers {
				errs = append(errs, fmt.Errorf("%s on %s: %d threads x %d registers need %d of the block's %d", l.Kernel, k.Arch, threads, k.Registers, regs, lim.registers))
			}
			if shared := k.SharedBytes + l.SharedBytes; shared > lim.sharedBytes {
				errs = append(errs, fmt.Errorf("%s on %s: %d bytes of static and %d of dynamic shared memory exceed the block's %d", l.Kernel, k.Arch, k.SharedBytes, l.SharedBytes, lim.sharedBytes))
			}
		}
	}
	return errs
}
