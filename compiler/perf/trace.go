package perf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/internal/cachefile"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/emu"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// Accesses are one launch's memory accesses, counted on the emulator
// (emu.Module.Trace) over a sample of its blocks and scaled to the grid.
type Accesses struct {
	// Shared memory: warp-level accesses, the wavefronts they took, and
	// the wavefronts they would take without bank conflicts.
	SharedAccesses, SharedWavefronts, SharedIdeal float64
	// Global memory: warp-level accesses, 32-byte sectors, bytes requested.
	GlobalAccesses, GlobalSectors, GlobalBytes float64
	// Tiles: wmma loads and stores (counted in the above too).
	Tiles float64
}

// traceSample is how many interior blocks per grid dimension a trace runs
// at most (besides the first and last of each): SampleBlocks's argument.
var traceSample = [3]int{6, 3, 3}

// traceReuseFLOPs is the sampled FLOPs from which a launch repeating an
// earlier one's key takes that one's counts instead of running: the convs
// that make a trace slow. Cheaper launches, the elementwise ones among
// them, always run. Where a kernel's loads depend on the data (relu_grad
// and the gradients of convs fused with a ReLU load dy only where y > 0),
// a reused launch carries its first occurrence's counts, and the launches
// after a reused one see other leftover data (a launch not run writes
// nothing, as the blocks a sample leaves out write nothing): the arena is
// random, not the model's data, either way.
const traceReuseFLOPs = 1e7

// traceVersion changes when what a trace counts changes (the cache key).
const traceVersion = "trace-2"

// TraceStep runs one training step of comp on the CPU emulator built for
// tracing (emu.TraceFlags) and counts every launch's accesses. The arena
// holds random floats (valid class labels): access patterns that depend on
// the data (ReLU masks, max-pool routing) see random data, not the model's.
// Each launch runs a sample of its blocks (launchSample); an expensive one
// (traceReuseFLOPs) whose kernel, geometry and arguments repeat an earlier
// one's (launchKey: a ResNet's identical blocks, recomputed forward
// layers) takes that one's counts without running. Results are cached by
// the source and the launches, in CacheDir.
func TraceStep(comp *trainergen.Compiled) ([]Accesses, error) {
	return traceStep(comp, launchSample, expensive, processMemo, true)
}

// traceMemo is the counts of reusable launches traced so far, by
// reuseKey: a later launch with the same key — in the same step, or in
// another step compiling the same kernel, as a data-parallel rank's plan
// beside the one-GPU plan of cnnc plan --scaling — takes them.
type traceMemo struct {
	mu sync.Mutex
	m  map[string]Accesses
}

func newTraceMemo() *traceMemo { return &traceMemo{m: map[string]Accesses{}} }

func (t *traceMemo) get(k string) (Accesses, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.m[k]
	return a, ok
}

func (t *traceMemo) put(k string, a Accesses) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[k]; !ok {
		t.m[k] = a
	}
}

// processMemo is TraceStep's memo for the process: one entry per distinct
// expensive launch of the steps it traced.
var processMemo = newTraceMemo()

// reuseKey is launchKey with the code the kernel runs: the source's
// prelude (its shared definitions) and the kernel's own text.
func reuseKey(comp *trainergen.Compiled, l trainer.Launch) string {
	h := sha256.New()
	src := comp.Train.Source
	for _, k := range comp.Train.Kernels {
		if i := bytes.Index(src, []byte(k.Text)); i >= 0 {
			h.Write(src[:i]) // the prelude: everything before the first kernel
			break
		}
	}
	for _, k := range comp.Train.Kernels {
		if k.Name == l.Kernel {
			h.Write([]byte(k.Text))
		}
	}
	return hex.EncodeToString(h.Sum(nil)) + " " + launchKey(l)
}

// expensive says whether tracing l costs traceReuseFLOPs or more.
func expensive(l trainer.Launch) bool {
	return sampledFLOPs(l, launchSample(l)) >= traceReuseFLOPs
}

// sampledFLOPs is the FLOPs of l's blocks in sample.
func sampledFLOPs(l trainer.Launch, sample []emu.BlockSample) float64 {
	return float64(l.FLOPs) / (float64(l.Grid[0]) * float64(l.Grid[1]) * float64(l.Grid[2])) * float64(len(sample))
}

// launchSample is the blocks a trace of l runs.
func launchSample(l trainer.Launch) []emu.BlockSample {
	return emu.SampleBlocks(emu.Dim3{X: l.Grid[0], Y: l.Grid[1], Z: l.Grid[2]}, traceSample)
}

// launchKey is what a launch's access counts depend on besides the data:
// the kernel, its geometry, its integer and float arguments, each buffer's
// arena and offset modulo 32 bytes (global memory is counted in 32-byte
// sectors: moving every access of a buffer by whole sectors leaves each
// warp's sector count as it was; shared memory is the block's own) and
// which buffers are the same one (in place). Two launches with the same key
// run the same accesses on different data.
func launchKey(l trainer.Launch) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %v %v %d", l.Kernel, l.Grid, l.Block, l.SharedBytes)
	for i, a := range l.Args {
		same := -1 // the first earlier buffer argument at the same place
		if a.Kind == kernelarg.Buffer {
			for j, e := range l.Args[:i] {
				if e.Kind == kernelarg.Buffer && e.Arena == a.Arena && e.Offset == a.Offset {
					same = j
					break
				}
			}
		}
		fmt.Fprintf(&b, " %d:%d:%d:%d:%x:%d", a.Kind, a.Arena, a.Offset%32, a.Int, math.Float32bits(a.Float), same)
	}
	return b.String()
}

// traceStep traces each launch with the blocks sample gives (nil: every
// block); a launch that reuse accepts and whose reuseKey memo holds takes
// those counts without running (reuse nil: none), and the ones it traces
// go into memo. With $CNNC_PERF_SITES set it neither reads nor writes the
// cache nor reuses counts, and dumps the sites of the launches it names
// (dumpSites).
func traceStep(comp *trainergen.Compiled, sample func(trainer.Launch) []emu.BlockSample, reuse func(trainer.Launch) bool, memo *traceMemo,
	cached bool) ([]Accesses, error) {
	reusable := func(l trainer.Launch) bool { return reuse != nil && memo != nil && reuse(l) }
	dump := os.Getenv("CNNC_PERF_SITES")
	if dump != "" {
		cached, memo = false, nil // trace every launch again
	}
	spec := comp.Spec
	key := sha256.New()
	fmt.Fprintf(key, "%s\x00%v\x00%g\x00%s\x00", traceVersion, traceSample, traceReuseFLOPs, comp.Train.Source)
	for _, l := range spec.Train.Launches {
		fmt.Fprintf(key, "%s %v %v %d %v\n", l.Kernel, l.Grid, l.Block, l.SharedBytes, l.Args)
	}
	cache := filepath.Join(CacheDir(), "trace-"+hex.EncodeToString(key.Sum(nil)[:16])+".json")
	if data, err := os.ReadFile(cache); err == nil && cached {
		var out []Accesses
		if json.Unmarshal(data, &out) == nil && len(out) == len(spec.Train.Launches) {
			for i, l := range spec.Train.Launches {
				if reusable(l) {
					memo.put(reuseKey(comp, l), out[i])
				}
			}
			return out, nil
		}
	}
	flags := emu.TraceFlags
	if dump != "" {
		flags = append(slices.Clone(flags), "-g") // addr2line names the sites' lines
	}
	mod, err := emu.Compile(comp.Train.Source, "trace.cu", emu.Options{Flags: flags})
	if err != nil {
		return nil, err
	}
	defer mod.Close()
	arena, err := emu.Alloc(int(spec.ArenaBytes))
	if err != nil {
		return nil, err
	}
	defer emu.Free(arena)
	if err := emu.CopyIn(arena, InitArena(spec, 1)); err != nil {
		return nil, err
	}
	out := make([]Accesses, len(spec.Train.Launches))
	for i, l := range spec.Train.Launches {
		if reusable(l) {
			if a, ok := memo.get(reuseKey(comp, l)); ok {
				out[i] = a
				continue
			}
		}
		grid := emu.Dim3{X: l.Grid[0], Y: l.Grid[1], Z: l.Grid[2]}
		sites, err := mod.Trace(l.Kernel, grid, emu.Dim3{X: l.Block[0], Y: l.Block[1], Z: l.Block[2]}, l.SharedBytes,
			StepParams(spec, l, arena), sample(l))
		if err != nil {
			return nil, fmt.Errorf("perf: tracing launch %d (%s): %w", i, l.Kernel, err)
		}
		out[i] = sumSites(sites)
		if dump != "" && strings.Contains(l.Kernel, dump) {
			dumpSites(os.Stderr, mod.Path(), i, l.Kernel, sites)
		}
		if reusable(l) {
			memo.put(reuseKey(comp, l), out[i])
		}
	}
	if data, err := json.Marshal(out); err == nil && cached {
		cachefile.Write(cache, data)
	}
	return out, nil
}

// dumpSites writes a launch's access sites to w, the most shared-memory
// wavefronts first, each with its source line (addr2line on the module's
// library): the debug dump of CNNC_PERF_SITES=SUBSTRING, which traces the
// launches whose kernel's name holds SUBSTRING again (no cache) and writes
// theirs to stderr.
func dumpSites(w io.Writer, lib string, i int, kernel string, sites []emu.AccessSite) {
	sites = slices.Clone(sites)
	sort.SliceStable(sites, func(a, b int) bool {
		if sites[a].Space != sites[b].Space {
			return sites[a].Space == emu.Shared
		}
		return sites[a].Transactions > sites[b].Transactions
	})
	args := []string{"-e", lib}
	for _, s := range sites {
		args = append(args, fmt.Sprintf("%#x", s.PC))
	}
	lines := make([]string, len(sites))
	if out, err := exec.Command("addr2line", args...).Output(); err == nil {
		copy(lines, strings.Split(strings.TrimSpace(string(out)), "\n"))
	}
	a := sumSites(sites)
	fmt.Fprintf(w, "launch %d %s: shared %.0f accesses, %.0f wavefronts (ideal %.0f)\n", i, kernel, a.SharedAccesses, a.SharedWavefronts, a.SharedIdeal)
	for j, s := range sites {
		kind := "load"
		if s.Store {
			kind = "store"
		}
		if s.Matrix {
			kind += " matrix"
		}
		if s.Async {
			kind += " async"
		}
		fmt.Fprintf(w, "  %-6s %-13s w%-2d acc %10.0f lanes/acc %5.1f trans %10.0f (%.2f/acc)  %s\n", s.Space, kind, s.Width,
			s.Accesses, s.Lanes/math.Max(s.Accesses, 1), s.Transactions, s.Transactions/math.Max(s.Accesses, 1), filepath.Base(lines[j]))
	}
}

// sumSites adds a launch's sites up.
func sumSites(sites []emu.AccessSite) Accesses {
	var a Accesses
	for _, s := range sites {
		if s.Matrix {
			a.Tiles += s.Accesses
		}
		if s.Space == emu.Shared {
			a.SharedAccesses += s.Accesses
			a.SharedWavefronts += s.Transactions
			// without conflicts: one wavefront per 128 bytes, at least one
			// per access
			a.SharedIdeal += math.Max(s.Accesses, s.Bytes/128)
		} else {
			a.GlobalAccesses += s.Accesses
			a.GlobalSectors += s.Transactions
			a.GlobalBytes += s.Bytes
		}
	}
	return a
}

// InitArena is a training arena's contents for running a step without
// data: random floats in [-1, 1) everywhere (parameters, state, pixels as
// bytes), valid class labels in the labels tensor, and the step's scalar
// block (device.StepScalars) with the spec's learning rate and seed, step 1
// (not the first, whose optimizer branches differ) and the whole batch
// valid.
func InitArena(spec *trainer.Spec, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 31))
	b := make([]byte, spec.ArenaBytes)
	for i := 0; i+4 <= len(b); i += 4 {
		binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(2*rng.Float64()-1)))
	}
	for i := int64(0); i < spec.Train.Labels.Elems(); i++ {
		binary.LittleEndian.PutUint32(b[spec.Train.Labels.Offset+4*i:], uint32(rng.IntN(spec.Classes)))
	}
	device.StepScalars{Step: 1, Seed: spec.Seed, Valid: int64(spec.Batch), LR: spec.LR}.Put(b[spec.Scalars:])
	return b
}

// StepParams are launch l's 8-byte argument values with the training
// arena at base (the step's scalars are in the arena's scalar block, as
// InitArena writes it).
func StepParams(spec *trainer.Spec, l trainer.Launch, base emu.Ptr) []uint64 {
	params := make([]uint64, len(l.Args))
	for i, a := range l.Args {
		switch a.Kind {
		case kernelarg.Buffer:
			params[i] = uint64(base) + uint64(a.Offset)
		case kernelarg.Int:
			params[i] = uint64(a.Int)
		case kernelarg.Float:
			params[i] = uint64(math.Float32bits(a.Float))
		case kernelarg.Scalars:
			params[i] = uint64(base) + uint64(spec.Scalars)
		default:
			panic(fmt.Sprintf("perf: unknown launch argument kind %d", a.Kind))
		}
	}
	return params
}
