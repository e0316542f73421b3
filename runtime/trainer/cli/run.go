package cli

import (
	"errors"
	"fmt"
	"github.com/cnnc/cnnc/runtime/dist"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/units"
)

// usageError is a bad command line (exit 2).
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// exitCode is the exit status for an error of a run's step.
func exitCode(err error) int {
	var u usageError
	var d *trainer.DivergedError
	switch {
	case errors.As(err, &u):
		return ExitUsage
	case errors.As(err, &d):
		return ExitDiverged
	}
	return ExitError
}

// runner is one run of a trainer: each step opens what the next needs,
// and close releases all of it.
type runner struct {
	spec     *trainer.Spec
	backends trainer.Backends
	o        *options
	out      io.Writer
	lock     *checkpoint.Lock
	dev      device.Device
	sess     *trainer.Session
	resumed  *trainer.RunState // the checkpoint's run, when resuming
	meta     map[string]string // the --resume checkpoint's metadata
	best     *trainer.Best     // --keep-best, --patience
	train    data.Dataset
	test     data.Dataset
	log      *jsonLog
	closers  []func() error
	rank     *dist.Config  // a data-parallel rank's (nil: one device)
	job      *dist.Session // a data-parallel rank's membership in its job
	failure  error         // the run's error, unless every rank stops alike (an interrupt, a diverging loss)
}

// run carries out the command line: the steps below, in order.
func run(spec *trainer.Spec, backends trainer.Backends, o *options) (code int, err error) {
	r := &runner{spec: spec, backends: backends, o: o, out: o.stdout}
	defer r.close()
	defer func() {
		err = r.namingTheJob(err)
		if code != ExitInterrupted && code != ExitDiverged { // (every rank stops alike then)
			r.failure = err
		}
	}()
	if code, err, done := r.parallel(); done {
		return code, err
	}
	for _, step := range []func() error{r.checkOptions, r.lockCheckpoint, r.openSession, r.joinRanks} {
		if err := step(); err != nil {
			return exitCode(err), err
		}
	}
	if o.bench > 0 {
		return r.runBench()
	}
	for _, step := range []func() error{r.restore, r.useLR, r.openData} {
		if err := step(); err != nil {
			return exitCode(err), err
		}
	}
	if o.evalOnly {
		return r.evalOnly()
	}
	return r.runTraining()
}

func (r *runner) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

func (r *runner) warn(msg string) { fmt.Fprintf(r.o.stderr, "warning: %s\n", msg) }

// checkOptions refuses flag values that cannot work, before any work.
// Training-only settings are not checked for --eval-only.
func (r *runner) checkOptions() error {
	o, spec := r.o, r.spec
	switch {
	case o.batch < 1:
		return usagef("--batch must be at least 1, got %d", o.batch)
	case spec.DataParallel != nil && o.batch != spec.DataParallel.GlobalBatch:
		return usagef("--batch %d: this trainer's %d ranks were compiled for the global batch %d (each its share of %d); rebuild with `cnnc build --gpus %d --batch %d`", o.batch, spec.DataParallel.Ranks, spec.DataParallel.GlobalBatch, spec.Batch, spec.DataParallel.Ranks, o.batch)
	case spec.DataParallel == nil && o.batch > spec.Batch:
		return usagef("--batch %d: this trainer was compiled for batches of at most %d (its kernels and memory plan are specialised); rebuild with `cnnc build --batch %d`", o.batch, spec.Batch, o.batch)
	case o.device != "auto" && o.device != "cpu" && o.device != "cuda":
		return usagef("--device %s: want auto, cpu or cuda", o.device)
	case o.evalOnly:
		return r.checkMemoryBudget()
	case o.init != "" && o.resume != "":
		return usagef("--init and --resume exclude each other: --resume continues a run, --init starts one from given weights")
	case o.plot != "" && !strings.HasSuffix(strings.ToLower(o.plot), ".png") && !strings.HasSuffix(strings.ToLower(o.plot), ".svg"):
		return usagef("--plot %s: write a .png or .svg file", o.plot)
	}
	if o.bench == 0 {
		if err := r.checkDataGiven(); err != nil {
			return err
		}
	}
	if o.resume == "" { // else the checkpoint's rate may replace it
		if _, err := r.lr32(); err != nil {
			return err
		}
	}
	if err := checkOutputFolder("plot", o.plot); err != nil {
		return err
	}
	if err := checkNotNegative(map[string]int64{"epochs": int64(o.epochs), "max-steps": o.maxSteps, "profile": int64(o.profile), "bench": int64(o.bench)}); err != nil {
		return err
	}
	if err := r.checkBestOptions(); err != nil {
		return err
	}
	if _, _, err := parseRoofline(o.roofline); err != nil {
		return usageError{err}
	}
	return r.checkMemoryBudget()
}

// checkOutputFolder refuses a file a flag names (when given) in a folder
// that does not exist, before any work: --plot is written after training.
func checkOutputFolder(flag, path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--%s %s: the folder %s does not exist", flag, path, dir)
	case err != nil:
		return fmt.Errorf("--%s %s: %w", flag, path, err)
	case !fi.IsDir():
		return fmt.Errorf("--%s %s: %s is not a folder", flag, path, dir)
	}
	return nil
}

// checkNotNegative refuses a negative count, naming its flag (the first
// in alphabetical order when several are).
func checkNotNegative(counts map[string]int64) error {
	for _, flag := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[flag]; n < 0 {
			return usagef("--%s %d: want 0 or more", flag, n)
		}
	}
	return nil
}

// checkBestOptions checks --keep-best, --keep-best-by and --patience.
func (r *runner) checkBestOptions() error {
	o := r.o
	if o.keepBest == "" && o.patience == 0 {
		if o.changed("keep-best-by") {
			return usagef("--keep-best-by chooses the best epoch for --keep-best or --patience: give one of them")
		}
		return nil
	}
	best, err := trainer.NewBest(o.keepBestBy, o.patience)
	if err != nil {
		if o.patience < 0 {
			return usagef("--patience %d: want 0 (never stop early) or more epochs", o.patience)
		}
		return usagef("--keep-best-by %w", err)
	}
	flag := "--keep-best"
	if o.keepBest == "" {
		flag = "--patience"
	}
	switch {
	case o.test == "":
		return usagef("%s needs --test: the best epoch is the one with the best test %s", flag, o.keepBestBy)
	case o.keepBest != "" && o.checkpoint != "" && samePath(o.keepBest, o.checkpoint):
		return usagef("--keep-best %s is the --checkpoint: give the best epoch a file of its own", o.keepBest)
	}
	r.best = best
	return nil
}

// samePath says whether two paths name the same file (by their absolute
// forms: neither need exist yet).
func samePath(a, b string) bool {
	x, errA := filepath.Abs(a)
	y, errB := filepath.Abs(b)
	return errA == nil && errB == nil && x == y
}

func (r *runner) checkMemoryBudget() error {
	o, spec := r.o, r.spec
	if o.memoryBudget == "" {
		return nil
	}
	budget, err := units.ParseSize(o.memoryBudget)
	if err != nil {
		return usagef("--memory-budget: %v", err)
	}
	if spec.ArenaBytes > budget {
		return usagef("--memory-budget %s: this trainer's memory plan needs %s; rebuild it to fit: cnnc build --memory-budget %s %s", o.memoryBudget, sizeWithBytes(spec.ArenaBytes), o.memoryBudget, spec.Source)
	}
	return nil
}

// sizeWithBytes prints a size in the unit that fits, with the exact count.
func sizeWithBytes(n int64) string { return fmt.Sprintf("%s (%d bytes)", units.FormatBytes(n), n) }

// lockCheckpoint makes this run the one writer of --checkpoint, before
// any work: a missing or unwritable folder, or another trainer writing the
// same file, stops the run here. Temporary files of earlier writers are
// removed: whoever held the lock is gone.
func (r *runner) lockCheckpoint() error {
	if r.o.evalOnly {
		return nil
	}
	if err := r.lockFile("checkpoint", r.o.checkpoint); err != nil {
		return err
	}
	return r.lockFile("keep-best", r.o.keepBest)
}

// lockFile takes the lock of a checkpoint file a flag names (when given).
func (r *runner) lockFile(flag, path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return usagef("--%s %s: not a regular file", flag, path)
	}
	lock, err := checkpoint.Acquire(path, fmt.Sprintf("a trainer of model %s", r.spec.Model))
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	if flag == "checkpoint" {
		r.lock = lock
	}
	r.closers = append(r.closers, lock.Release)
	if _, err := checkpoint.RemoveStaleTemps(path); err != nil {
		return fmt.Errorf("--%s %s: removing an earlier writer's temporary files: %w", flag, path, err)
	}
	return nil
}

// openSession opens the device and allocates the planned arena on it.
func (r *runner) openSession() error {
	o, spec := r.o, r.spec
	warn := r.warn
	if r.rank != nil {
		// a data-parallel rank trains on its GPU or stops: NVIDIA's NCCL
		// sums device memory, not the CPU emulator's host memory
		warn = nil
	}
	dev, err := trainer.OpenDevice(spec, r.backends, o.device, warn)
	if err != nil {
		return fmt.Errorf("--device %w", err)
	}
	r.dev = dev
	r.closers = append(r.closers, dev.Close)
	fmt.Fprintf(r.out, "%s on %s: batch %d, arena %s (the planned peak, allocated once)\n", spec.Model, dev.Name(), o.batch, sizeWithBytes(spec.ArenaBytes))
	fmt.Fprint(r.out, spec.PlanSummary)
	if err := r.checkDeviceMemory(); err != nil {
		return err
	}
	if (o.test != "" || o.evalOnly) && spec.EvalArenaBytes > 0 {
		// evaluation did not fit the training arena's temporary space: it
		// runs in an arena of its own, allocated when it first runs
		fmt.Fprintf(r.out, "evaluation: a second arena of %s besides the training arena\n", sizeWithBytes(spec.EvalArenaBytes))
	}
	sess, err := trainer.NewSession(spec, dev, o.seed)
	if err != nil {
		return err
	}
	r.sess = sess
	r.closers = append(r.closers, sess.Close)
	r.useGraphs()
	return nil
}

// checkDeviceMemory stops before allocating when the device has less free
// memory than the plan: out of memory is a compile-time fact.
func (r *runner) checkDeviceMemory() error {
	mi, ok := r.dev.(interface{ MemInfo() (int64, int64, error) })
	if !ok {
		return nil
	}
	free, total, err := mi.MemInfo()
	if err != nil {
		return nil
	}
	fmt.Fprintf(r.out, "device memory: %s free of %s\n", units.FormatBytes(free), units.FormatBytes(total))
	if need := r.spec.ArenaBytes; need > free {
		return fmt.Errorf("this trainer's memory plan needs %s but %s has %s free; rebuild it to fit: cnnc build --memory-budget %dB %s (recomputation and micro-batching trade time for memory), or free the device",
			sizeWithBytes(need), r.dev.Name(), units.FormatBytes(free), free, r.spec.Source)
	}
	return nil
}

func (r *runner) useGraphs() {
	if !r.o.cudaGraph {
		return
	}
	if _, can := r.dev.(device.Grapher); can {
		r.sess.UseGraphs = true
		r.sess.Warnf = func(format string, args ...any) { r.warn("--cuda-graph: " + fmt.Sprintf(format, args...)) }
	} else if r.o.changed("cuda-graph") {
		r.warn(fmt.Sprintf("--cuda-graph: %s cannot replay graphs; launching kernels one by one", r.dev.Name()))
	}
}

// restore loads --resume (everything, and the run's settings unless
// given on the command line) or --init (parameters only).
func (r *runner) restore() error {
	o := r.o
	if o.init != "" {
		if _, err := r.sess.Load(o.init, false); err != nil {
			return fmt.Errorf("--init: %w", err)
		}
		fmt.Fprintf(r.out, "parameters from %s\n", o.init)
		return nil
	}
	if o.resume == "" {
		return nil
	}
	meta, err := r.sess.Load(o.resume, !o.evalOnly)
	if err != nil {
		return fmt.Errorf("--resume: %w", err)
	}
	if meta[trainer.MetaModel] != r.spec.Model {
		return fmt.Errorf("--resume %s: a checkpoint of model %q, not %q", o.resume, meta[trainer.MetaModel], r.spec.Model)
	}
	if o.evalOnly {
		fmt.Fprintf(r.out, "parameters from %s (step %s)\n", o.resume, meta[trainer.MetaStep])
		return nil
	}
	st, err := trainer.ParseRunState(meta)
	if err == nil && !st.HasPosition() {
		err = errors.New("it does not say where its run was (no epoch in its metadata): was it written by a trainer's --checkpoint? --init takes its parameters")
	}
	if err != nil {
		return fmt.Errorf("--resume %s: %w", o.resume, err)
	}
	if err := r.adoptRunSettings(meta, st); err != nil {
		return err
	}
	r.meta = meta
	if saved, now := meta[trainer.MetaSchedule], r.spec.Schedule; saved != "" && saved != now.String() || saved == "" && !now.IsConstant() {
		// a trainer rebuilt with another schedule: its rates from here on
		fmt.Fprintf(r.out, "the train block's learning-rate schedule %s replaces the checkpoint's %s\n", now, orConstant(saved))
	}
	r.resumed = &st
	return nil
}

func orConstant(schedule string) string {
	if schedule == "" {
		return "constant"
	}
	return schedule
}

// adoptRunSettings takes the resumed run's settings, except those given
// on the command line, saying which it overrides. The batch size must be
// the run's: the position counts its batches.
func (r *runner) adoptRunSettings(meta map[string]string, st trainer.RunState) error {
	o := r.o
	if st.Has["batch_size"] && st.Batch != o.batch {
		return usagef("--resume %s: the run trained with --batch %d; resume with the same batch (its position counts batches of that size)", o.resume, st.Batch)
	}
	type setting struct {
		flag, saved, given string
		adopt              func() error
	}
	settings := []setting{
		{"lr", meta[trainer.MetaLR], strconv.FormatFloat(o.lr, 'g', -1, 64), func() (err error) {
			o.lr, err = strconv.ParseFloat(meta[trainer.MetaLR], 64)
			return err
		}},
		{"seed", meta[trainer.MetaSeed], strconv.FormatUint(o.seed, 10), func() (err error) {
			o.seed, err = strconv.ParseUint(meta[trainer.MetaSeed], 10, 64)
			return err
		}},
		{"epochs", strconv.Itoa(st.Epochs), strconv.Itoa(o.epochs), func() error { o.epochs = st.Epochs; return nil }},
		{"no-shuffle", strconv.FormatBool(st.NoShuffle), strconv.FormatBool(o.noShuffle), func() error { o.noShuffle = st.NoShuffle; return nil }},
	}
	for _, s := range settings {
		key := map[string]string{"no-shuffle": "no_shuffle"}[s.flag]
		if key == "" {
			key = s.flag
		}
		if _, saved := meta[key]; !saved {
			continue // an older checkpoint: the command line's value
		}
		if !o.changed(s.flag) {
			if err := s.adopt(); err != nil {
				return fmt.Errorf("--resume %s: metadata %q = %q: %v", o.resume, key, s.saved, err)
			}
		} else if s.given != s.saved {
			fmt.Fprintf(r.out, "--%s %s overrides the checkpoint's %s\n", s.flag, s.given, s.saved)
		}
	}
	r.sess.Seed = o.seed
	return nil
}

// useLR sets the learning rate, refusing one float32 cannot hold, named
// by where it came from.
func (r *runner) useLR() error {
	if r.o.evalOnly {
		return nil // evaluation does not read it
	}
	lr, err := r.lr32()
	if err != nil {
		return err
	}
	r.sess.LR = lr
	return nil
}

// lr32 is --lr as the kernels' float32, or a usage error naming where
// the rate came from.
func (r *runner) lr32() (float32, error) {
	lr, err := trainer.LR32(r.o.lr)
	if err != nil {
		from := ""
		switch {
		case r.o.changed("lr"):
		case r.resumed != nil:
			from = " (the checkpoint's)"
		default:
			from = " (the train block's)"
		}
		return 0, usagef("--lr %v%s: %v", r.o.lr, from, err)
	}
	return lr, nil
}
