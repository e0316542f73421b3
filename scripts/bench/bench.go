//go:build ignore

// bench runs cnnc's CPU-side benchmarks side by side with PyTorch (Debian's
// python3-torch, CPU) when it is installed, and prints Markdown tables:
// memory, training images/s, data loading images/s and compile times, each
// a median of several runs with its ratio to PyTorch.
//
//	go run scripts/bench/bench.go [-runs 5] > bench-results.md
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
	"github.com/cnnc/cnnc/runtime/trainer"
)

var runs = flag.Int("runs", 5, "repetitions of each timing (the median is reported)")

const python = "/usr/bin/python3"

func main() {
	flag.Parse()
	haveTorch := exec.Command(python, "-c", "import torch, torchvision").Run() == nil
	fmt.Printf("# CPU benchmarks\n\n%s, %d cores (GOMAXPROCS %d), %s. ", time.Now().Format("2006-01-02"), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if haveTorch {
		out, _ := exec.Command(python, "-c", "import torch; print(torch.__version__)").Output()
		fmt.Printf("PyTorch %s (Debian python3-torch, CPU).\n\n", strings.TrimSpace(string(out)))
	} else {
		fmt.Printf("PyTorch is not installed (apt-get install python3-torch python3-torchvision): no ratios.\n\n")
	}
	memory(haveTorch)
	training(haveTorch)
	loading(haveTorch)
	compiling()
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

// stepTime is the median seconds per training step of a model on the CPU
// backend, on random uint8 batches.
func stepTime(path string, batch int64, steps int) float64 {
	res := compile(path, batch)
	c := must(driver.Compile(res, plan.Config{}, driver.CUDA))
	dev := must(cpudev.New(c.Kernels, "kernels.cu", cpudev.Options{}))
	defer dev.Close()
	sess := must(trainer.NewSession(c.Spec, dev, 1))
	defer sess.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	b := trainer.Batch{Valid: int(batch), Pixels: make([]uint8, int(batch)*c.Spec.H*c.Spec.W*c.Spec.C), Labels: make([]int32, batch)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(c.Spec.Classes))
	}
	var ts []float64
	for i := 0; i < steps+2; i++ {
		t0 := time.Now()
		if _, _, err := sess.TrainStep(b); err != nil {
			must(0, err)
		}
		if i >= 2 {
			ts = append(ts, time.Since(t0).Seconds())
		}
	}
	return median(ts)
}

func training(haveTorch bool) {
	fmt.Printf("## Training on the CPU: images/s (one step = forward, backward, SGD-momentum update)\n\ncnnc: the generated CUDA C on the CPU emulator (runtime/cpu), `Session.TrainStep` on random uint8 batches, median of %d steps. PyTorch: `scripts/bench/torch_train.py train` (eager, %d threads, same model, batch, fp32, uint8 input converted in the step).\n\n", *runs, runtime.NumCPU())
	var torch map[string]float64
	if haveTorch {
		out := must(exec.Command(python, "scripts/bench/torch_train.py", "train", "--threads", fmt.Sprint(runtime.NumCPU()), "--steps", fmt.Sprint(*runs)).Output())
		json.Unmarshal(out, &torch)
	}
	fmt.Println("| model | batch | cnnc step | cnnc images/s | PyTorch images/s | cnnc / PyTorch |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, c := range []struct {
		name, path, key string
		batch           int64
	}{{"simplecnn", "examples/simplecnn.cnn", "simplecnn_b32_images_per_s", 32}, {"mnist", "examples/mnist.cnn", "mnist_b64_images_per_s", 64}} {
		t := stepTime(c.path, c.batch, *runs)
		ips := float64(c.batch) / t
		tt, ratio := "—", "—"
		if v, ok := torch[c.key]; ok {
			tt, ratio = fmt.Sprintf("%.0f", v), fmt.Sprintf("%.2fx", ips/v)
		}
		fmt.Printf("| %s | %d | %.3f s | %.0f | %s | %s |\n", c.name, c.batch, t, ips, tt, ratio)
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
