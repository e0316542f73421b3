//go:build ignore

// bench runs cnnc's CPU-side benchmarks side by side with PyTorch (Debian's
// python3-torch, CPU) when it is installed, and prints Markdown tables:
// memory, training images/s, data loading images/s and compile times, each
// a median of several runs with its ratio to PyTorch.
//
//	go run scripts/bench/bench.go [-runs 5] [-threads 2] [-emu=false] [-only training,...] > bench-results.md
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"github.com/cnnc/cnnc/driver"
	"image"
	"image/jpeg"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/internal/datasets"
	cpudev "github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

var (
	runs     = flag.Int("runs", 5, "repetitions of each timing (the median is reported); training: steps per round (SimpleCNN at batch 256: half, MNIST: 5x)")
	rounds   = flag.Int("rounds", 3, "training: alternating rounds of cnnc's and PyTorch's steps")
	threads  = flag.Int("threads", 2, "threads of the CPU target and of PyTorch in the training benchmarks")
	emu      = flag.Bool("emu", true, "also time the CUDA emulator in the training benchmarks (small batches only)")
	sections = flag.String("only", "memory,training,loading,compiling,epoch", "the benchmarks to run, comma-separated")
)

const python = "/usr/bin/python3"

func main() {
	flag.Parse()
	haveTorch := exec.Command(python, "-c", "import torch, torchvision").Run() == nil
	fmt.Printf("# CPU benchmarks\n\n%s, %s, %d cores (GOMAXPROCS %d), %s, load average %s at the start. ", time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), loadAverage())
	if haveTorch {
		out, _ := exec.Command(python, "-c", "import torch; print(torch.__version__)").Output()
		fmt.Printf("PyTorch %s (Debian python3-torch, CPU).\n\n", strings.TrimSpace(string(out)))
	} else {
		fmt.Printf("PyTorch is not installed (apt-get install python3-torch python3-torchvision): no ratios.\n\n")
	}
	for _, sec := range strings.Split(*sections, ",") {
		switch strings.TrimSpace(sec) {
		case "memory":
			memory(haveTorch)
		case "training":
			training(haveTorch)
		case "loading":
			loading(haveTorch)
		case "compiling":
			compiling()
		case "epoch":
			epoch(haveTorch)
		default:
			fmt.Fprintf(os.Stderr, "bench: -only: unknown benchmark %q (memory, training, loading, compiling, epoch)\n", sec)
			os.Exit(2)
		}
	}
}

// cpuModel is the first "model name" of /proc/cpuinfo, "unknown CPU" where there is none.
func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	return v
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func compile(path string, batch int64) *compiler.Result {
	src := must(os.ReadFile(path))
	return must(driver.Load(path, src, compiler.Options{Batch: batch}))
}

func memory(haveTorch bool) {
	fmt.Printf("## Memory: planned peak vs PyTorch eager\n\nCommand: `cnnc plan --batch B [--memory-budget X] examples/simplecnn.cnn`; PyTorch: `scripts/bench/torch_memory.py` (saved-for-backward tensors + parameters + gradients + momentum: a lower bound of its allocations).\n\n")
	torch := map[int64]float64{}
	if haveTorch {
		var rows []struct {
			Batch int64   `json:"batch"`
			Bound float64 `json:"lower_bound_bytes"`
		}
		if err := json.Unmarshal(must(exec.Command(python, "scripts/bench/torch_memory.py", "--json").Output()), &rows); err == nil {
			for _, r := range rows {
				torch[r.Batch] = r.Bound
			}
		}
	}
	fmt.Println("| batch | budget | cnnc planned peak | PyTorch eager | cnnc / PyTorch |")
	fmt.Println("|---|---|---|---|---|")
	for _, c := range []struct {
		batch  int64
		budget int64
	}{{32, 0}, {32, 40e6}, {256, 0}} {
		res := compile("examples/simplecnn.cnn", c.batch)
		p := must(driver.Plan(res, plan.Config{Budget: c.budget, BudgetSource: "--memory-budget"}, driver.CUDA))
		budget, ratio := "none", "—"
		if c.budget > 0 {
			budget = fmt.Sprintf("%.0f MB", float64(c.budget)/1e6)
		}
		tb := "—"
		if t, ok := torch[c.batch]; ok {
			tb = fmt.Sprintf("%.1f MB", t/1e6)
			ratio = fmt.Sprintf("%.1f%%", 100*float64(p.PeakBytes)/t)
		}
		fmt.Printf("| %d | %s | %.2f MB | %s | %s |\n", c.batch, budget, float64(p.PeakBytes)/1e6, tb, ratio)
	}
	fmt.Println()
}

// randomBatch is a full batch of random uint8 pixels and labels for spec.
func randomBatch(spec *trainer.Spec) trainer.Batch {
	rng := rand.New(rand.NewPCG(1, 2))
	n := spec.Batch
	b := trainer.Batch{Valid: n, Pixels: make([]uint8, n*spec.H*spec.W*spec.C), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(spec.Classes))
	}
	return b
}

// stepTimes appends to ts the seconds of each of steps training steps of sess, after warmup
// steps, on batch b.
func stepTimes(ts []float64, sess *trainer.Session, b trainer.Batch, warmup, steps int) []float64 {
	for i := 0; i < warmup+steps; i++ {
		t0 := time.Now()
		if _, _, err := sess.TrainStep(b); err != nil {
			must(0, err)
		}
		if i >= warmup {
			ts = append(ts, time.Since(t0).Seconds())
		}
	}
	return ts
}

// cpuSession opens a session of the CPU target (codegen/cpu's kernels on runtime/native, compiled
// with g++ at the trainers' flags, threads workers), no memory budget; close closes it.
func cpuSession(path string, batch int64, threads int) (sess *trainer.Session, spec *trainer.Spec, close func()) {
	c := must(driver.Compile(compile(path, batch), plan.Config{}, driver.CPU))
	dev := must(native.New(c.Kernels, "kernels.cc", native.Options{Workers: threads}))
	sess = must(trainer.NewSession(c.Spec, dev, 1))
	return sess, c.Spec, func() { sess.Close(); dev.Close() }
}

// emuStepTime is the median step time of the generated CUDA C on the CUDA emulator (runtime/cpu).
func emuStepTime(path string, batch int64, steps int) float64 {
	c := must(driver.Compile(compile(path, batch), plan.Config{}, driver.CUDA))
	dev := must(cpudev.New(c.Kernels, "kernels.cu", cpudev.Options{}))
	defer dev.Close()
	sess := must(trainer.NewSession(c.Spec, dev, 1))
	defer sess.Close()
	return median(stepTimes(nil, sess, randomBatch(c.Spec), 2, steps))
}

// torchStepTimes runs scripts/bench/torch_train.py train for one model and batch and appends
// its step times to ts; it stops the program when PyTorch fails.
func torchStepTimes(ts []float64, model string, batch int64, threads, steps int) []float64 {
	out, err := exec.Command(python, "scripts/bench/torch_train.py", "train", "--model", model, "--batch", fmt.Sprint(batch),
		"--threads", fmt.Sprint(threads), "--steps", fmt.Sprint(steps)).Output()
	var r struct {
		Times []float64 `json:"step_times_s"`
	}
	if err == nil {
		err = json.Unmarshal(out, &r)
	}
	if err == nil && len(r.Times) != steps {
		err = fmt.Errorf("%d step times, want %d", len(r.Times), steps)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: torch_train.py %s batch %d: %v\n", model, batch, err)
		os.Exit(1)
	}
	return append(ts, r.Times...)
}

// loadAverage is the 1-minute load average (/proc/loadavg), "?" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

func training(haveTorch bool) {
	fmt.Printf("## Training on the CPU: images/s (one step = forward, backward, SGD-momentum update)\n\n"+
		"cnnc CPU target: `cnnc build --target cpu`'s kernels (codegen/cpu, compiled with the trainers' g++ flags) on runtime/native (workers: %d), "+
		"`Session.TrainStep` on random uint8 batches, no memory budget. "+
		"PyTorch: `scripts/bench/torch_train.py train` (eager, `torch.set_num_threads(%d)`, same model, batch, fp32, SGD momentum, uint8 input converted in the step). "+
		"Side by side: %d rounds, each N steps of cnnc (after 1 of warm-up, 2 in the first round) then N steps of PyTorch in a fresh process (after 3 of warm-up); "+
		"the medians over all rounds' steps. "+
		"The emulator column is the same step's CUDA C on the CUDA emulator (runtime/cpu), median of %d steps, at the small batches only. "+
		"Load: the 1-minute load average before and after each row.\n\n", *threads, *threads, *rounds, *runs)
	fmt.Println("| model | batch | rounds x N | load | cnnc CPU step | PyTorch step | cnnc CPU images/s | PyTorch images/s | **cnnc CPU / PyTorch** | emulator images/s |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range []struct {
		name, path string
		batch      int64
		steps      int
		emu        bool
	}{
		{"simplecnn", "examples/simplecnn.cnn", 32, *runs, true},
		{"simplecnn", "examples/simplecnn.cnn", 256, max(1, *runs/2), false},
		{"mnist", "examples/mnist.cnn", 64, 5 * *runs, true},
	} {
		load := loadAverage()
		sess, spec, closeSess := cpuSession(c.path, c.batch, *threads)
		b := randomBatch(spec)
		var ours, theirs []float64
		for r := 0; r < *rounds; r++ {
			warmup := 1
			if r == 0 {
				warmup = 2
			}
			ours = stepTimes(ours, sess, b, warmup, c.steps)
			if haveTorch {
				theirs = torchStepTimes(theirs, c.name, c.batch, *threads, c.steps)
			}
		}
		closeSess()
		t := median(ours)
		tt, tips, ratio := "—", "—", "—"
		if haveTorch {
			tt, tips, ratio = fmt.Sprintf("%.4f s", median(theirs)), fmt.Sprintf("%.0f", float64(c.batch)/median(theirs)), fmt.Sprintf("**%.2fx**", median(theirs)/t)
		}
		em := "—"
		if c.emu && *emu {
			em = fmt.Sprintf("%.0f", float64(c.batch)/emuStepTime(c.path, c.batch, *runs))
		}
		fmt.Printf("| %s | %d | %d x %d | %s-%s | %.4f s | %s | %.0f | %s | %s | %s |\n", c.name, c.batch, *rounds, c.steps, load, loadAverage(), t, tt, float64(c.batch)/t, tips, ratio, em)
	}
	fmt.Println()
}

// imageFolder writes n JPEGs of real MNIST digits, scaled to 256x256 RGB,
// in 10 class folders.
func imageFolder(n int) string {
	root := must(os.MkdirTemp("", "cnnc-bench-images-*"))
	dir := must(datasets.MNISTDir())
	ds := must(data.LoadMNIST(dir, "t10k"))
	for i := 0; i < n; i++ {
		img := image.NewRGBA(image.Rect(0, 0, 256, 256))
		src := ds.Images.Image(i)
		for y := 0; y < 256; y++ {
			for x := 0; x < 256; x++ {
				v := src[(y*28/256)*28+x*28/256]
				o := img.PixOffset(x, y)
				img.Pix[o], img.Pix[o+1], img.Pix[o+2], img.Pix[o+3] = v, 255-v, v/2, 255
			}
		}
		cls := filepath.Join(root, fmt.Sprintf("class%d", ds.Labels[i]))
		os.MkdirAll(cls, 0o755)
		f := must(os.Create(filepath.Join(cls, fmt.Sprintf("%05d.jpg", i))))
		must(0, jpeg.Encode(f, img, &jpeg.Options{Quality: 90}))
		f.Close()
	}
	return root
}

func loading(haveTorch bool) {
	const n = 512
	root := imageFolder(n)
	defer os.RemoveAll(root)
	shape := data.Shape{H: 128, W: 128, C: 3}
	cacheDir := must(os.MkdirTemp("", "cnnc-bench-cache-"))
	defer os.RemoveAll(cacheDir)
	opts := data.ImageFolderOptions{Shape: shape, CacheDir: cacheDir}
	var cold, warm []float64
	for r := 0; r < *runs; r++ {
		os.RemoveAll(cacheDir) // cold: no cache file
		t0 := time.Now()
		ds := must(data.OpenImageFolder(root, opts))
		readAll(ds)
		cold = append(cold, float64(n)/time.Since(t0).Seconds())
		ds.Close()
		t0 = time.Now()
		ds = must(data.OpenImageFolder(root, opts))
		readAll(ds)
		warm = append(warm, float64(n)/time.Since(t0).Seconds())
		ds.Close()
	}
	fmt.Printf("## Data loading: ImageFolder decode + resize to 128x128 RGB, images/s\n\n%d JPEGs (256x256, real MNIST digits scaled up) in 10 class folders. cnnc: `data.OpenImageFolder` + reading every image, median of %d runs; cold = no cache file, warm = from cnnc's uint8 cache. PyTorch: torchvision ImageFolder + Resize((128,128)) + ToTensor + DataLoader(batch 32, %d workers), one pass.\n\n", n, *runs, runtime.NumCPU())
	tv, ratio := "—", "—"
	if haveTorch {
		var out struct {
			IPS float64 `json:"images_per_s"`
		}
		if b, err := exec.Command(python, "scripts/bench/torch_train.py", "data", root, "--workers", fmt.Sprint(runtime.NumCPU())).Output(); err == nil && json.Unmarshal(b, &out) == nil {
			tv, ratio = fmt.Sprintf("%.0f", out.IPS), fmt.Sprintf("%.2fx / %.0fx", median(cold)/out.IPS, median(warm)/out.IPS)
		}
	}
	fmt.Println("| cnnc cold | cnnc warm (cache) | torchvision | cnnc / torchvision (cold / warm) |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| %.0f | %.0f | %s | %s |\n\n", median(cold), median(warm), tv, ratio)
}

func readAll(ds data.Dataset) {
	buf := make([]uint8, ds.Shape().Size())
	for i := 0; i < ds.Len(); i++ {
		must(0, ds.ReadImage(i, buf))
	}
}

func compiling() {
	fmt.Printf("## Compile times (median of %d runs)\n\n`cnnc` built once with `go build -o /tmp/cnnc-bench ./cmd/cnnc`; `build` is split into cnnc's own work (check, plan, kernels, module), nvcc (sm_80 + sm_90 of the generated .cu) and go build of the trainer (warm Go build cache).\n\n", *runs)
	bin := filepath.Join(os.TempDir(), "cnnc-bench")
	must(exec.Command("go", "build", "-o", bin, "./cmd/cnnc").CombinedOutput())
	timeCmd := func(args ...string) float64 {
		var ts []float64
		for r := 0; r < *runs; r++ {
			t0 := time.Now()
			if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "bench: cnnc %v: %v\n%s", args, err, out)
				os.Exit(1)
			}
			ts = append(ts, time.Since(t0).Seconds())
		}
		return median(ts)
	}
	fmt.Println("| model | cnnc check | cnnc plan | build: cnnc | build: nvcc | build: go build |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, m := range []string{"examples/simplecnn.cnn", "examples/mnist.cnn"} {
		check := timeCmd("check", m)
		pl := timeCmd("plan", m)
		dir := must(os.MkdirTemp("", "cnnc-bench-build-*"))
		own := timeCmd("build", m, "--emit-cuda", dir)
		cu := must(filepath.Glob(filepath.Join(dir, "*.cu")))[0]
		var nv []float64
		for r := 0; r < *runs; r++ {
			t0 := time.Now()
			if out, err := exec.Command("nvcc", "-fatbin", "-O3", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]", "-o", filepath.Join(dir, "k.fatbin"), cu).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "bench: nvcc: %v\n%s", err, out)
				nv = append(nv, -1)
				break
			}
			nv = append(nv, time.Since(t0).Seconds())
		}
		full := timeCmd("build", m, "-o", filepath.Join(dir, "trainer"))
		fmt.Printf("| %s | %.3f s | %.3f s | %.3f s | %.2f s | %.2f s |\n", filepath.Base(m), check, pl, own, median(nv), full-own)
		os.RemoveAll(dir)
	}
	fmt.Println()
}

// epoch times the OOM guide's pipeline end to end: a trainer of
// examples/simplecnn.cnn built for the CPU target (as cnnc build does)
// trains one epoch on an ImageFolder of JPEGs — decode, resize to 128x128,
// train at batch 32, then the test pass over the same folder — from a cold
// image cache; PyTorch does the same with torchvision's ImageFolder and a
// DataLoader (scripts/bench/torch_train.py epoch). The trainer's build is
// not timed.
func epoch(haveTorch bool) {
	const n = 2000
	nthreads := *threads
	root := imageFolder(n)
	defer os.RemoveAll(root)
	dir := must(os.MkdirTemp("", "cnnc-bench-epoch-*"))
	defer os.RemoveAll(dir)
	c := must(driver.Compile(compile("examples/simplecnn.cnn", 32), plan.Config{}, driver.CPU))
	bin := filepath.Join(dir, "simplecnn-trainer")
	must(0, driver.Build(c, driver.CPU, driver.BuildOptions{Dir: filepath.Join(dir, "module"), Output: bin}))
	cmd := exec.Command(bin, "--data", root, "--test", root, "--epochs", "1", "--quiet", "--cache-dir", filepath.Join(dir, "cache"))
	cmd.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", nthreads))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: the trainer: %v\n%s", err, out)
		os.Exit(1)
	}
	cnnc := time.Since(start).Seconds()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fmt.Printf("## One epoch end to end: ImageFolder of %d JPEGs, SimpleCNN, batch 32\n\n", n)
	fmt.Printf("256x256 RGB JPEGs (real MNIST digits scaled up) in 10 class folders; one training epoch then the test pass over the same folder, cold image cache. cnnc: the trainer `cnnc build --target cpu` builds (GOMAXPROCS=%d), its build not timed. PyTorch: `scripts/bench/torch_train.py epoch ROOT --threads %d --workers %d` (torchvision ImageFolder + Resize((128,128)) + ToTensor, DataLoader with %d workers, SGD momentum as the model's train block).\n\n", nthreads, nthreads, nthreads, nthreads)
	fmt.Printf("| | seconds | images/s (train + test) | last line |\n|---|---|---|---|\n")
	fmt.Printf("| cnnc CPU target | %.1f | %.0f | %s |\n", cnnc, 2*n/cnnc, lines[len(lines)-1])
	if haveTorch {
		var r struct {
			Seconds  float64 `json:"seconds"`
			Accuracy float64 `json:"test_accuracy"`
		}
		o := must(exec.Command(python, "scripts/bench/torch_train.py", "epoch", root, "--threads", fmt.Sprint(nthreads), "--workers", fmt.Sprint(nthreads)).Output())
		must(0, json.Unmarshal(o, &r))
		fmt.Printf("| PyTorch eager | %.1f | %.0f | test accuracy %.2f%% |\n", r.Seconds, 2*n/r.Seconds, 100*r.Accuracy)
		fmt.Printf("\ncnnc / PyTorch: **%.2fx** (time ratio, load average %s after)\n", r.Seconds/cnnc, loadAverage())
	}
	fmt.Println()
}
