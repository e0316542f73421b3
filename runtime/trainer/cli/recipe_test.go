package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/schedule"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// logLine is a --log line: a step's or an epoch's.
type logLine struct {
	Step       int64    `json:"step"`
	Epoch      int      `json:"epoch"`
	Batch      *int     `json:"batch"` // steps only
	LR         float32  `json:"lr"`
	TrainAcc   *float64 `json:"train_accuracy"` // epochs only
	TestAcc    float64  `json:"test_accuracy"`
	Throughput float64  `json:"images_per_second"`
	Best       bool     `json:"best"`
}

func readLog(t *testing.T, path string) (steps, epochs []logLine) {
	t.Helper()
	for _, l := range lines(t, path) {
		var x logLine
		require.NoError(t, json.Unmarshal([]byte(l), &x), l)
		if x.Batch != nil {
			steps = append(steps, x)
		} else {
			epochs = append(epochs, x)
		}
	}
	return steps, epochs
}

// The train block's schedule sets every step's rate (the --log says which:
// Schedule.LR of the base --lr), across a --resume in the middle of an
// epoch exactly as in one run; epochs log their last rate, accuracies and
// throughput, and --plot draws the rate and the throughput.
func TestScheduleLogResumeAndPlot(t *testing.T) {
	base, root := tiny(t)
	spec := *base
	spec.Schedule = schedule.Schedule{Kind: schedule.Cosine, EtaMin: 0.001, Warmup: 4}
	dir := t.TempDir()
	whole, part := filepath.Join(dir, "whole.jsonl"), filepath.Join(dir, "part.jsonl")
	ck, plot := filepath.Join(dir, "ck.safetensors"), filepath.Join(dir, "curves.svg")
	r := run(t, &spec, "--data", root, "--test", root, "--epochs", "3", "--lr", "0.04", "--log", whole, "--plot", plot, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "learning rate: cosine(eta_min=0.001), warmup 4 steps of base 0.04 (--lr) over 3 epochs of 3 steps")
	steps, epochs := readLog(t, whole)
	require.Len(t, steps, 9)
	for i, s := range steps {
		assert.Equal(t, float32(spec.Schedule.LR(float64(float32(0.04)), int64(i), 3, 3)), s.LR, "step %d", i)
	}
	require.Len(t, epochs, 3)
	for i, e := range epochs {
		assert.Equal(t, steps[3*i+2].LR, e.LR, "epoch %d: its last step's rate", i+1)
		require.NotNil(t, e.TrainAcc)
		assert.Greater(t, e.TestAcc, 0.0)
		assert.Greater(t, e.Throughput, 0.0)
	}
	assert.Contains(t, r.out, "lr 0.0")
	assert.Contains(t, r.out, " images/s")
	svg, err := os.ReadFile(plot)
	require.NoError(t, err)
	for _, want := range []string{"learning rate", "throughput", "images/s (training)"} {
		assert.Contains(t, string(svg), want)
	}

	r = run(t, &spec, "--data", root, "--test", root, "--epochs", "3", "--lr", "0.04", "--max-steps", "4", "--checkpoint", ck, "--log", part, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, "cosine(eta_min=0.001), warmup 4 steps", readMeta(t, ck)["lr_schedule"])
	assert.Equal(t, "0.04", readMeta(t, ck)["lr"], "the base rate")
	r = run(t, &spec, "--data", root, "--test", root, "--resume", ck, "--checkpoint", ck, "--log", part, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.NotContains(t, r.out, "replaces the checkpoint's")
	resumed, _ := readLog(t, part)
	assert.Equal(t, steps, resumed)

	other := spec
	other.Schedule = schedule.Schedule{Kind: schedule.Step, Every: 1, Gamma: 0.5}
	r = run(t, &other, "--data", root, "--resume", ck, "--epochs", "4", "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "the train block's learning-rate schedule step(every=1, gamma=0.5) replaces the checkpoint's cosine(eta_min=0.001), warmup 4 steps")

	assert.Contains(t, run(t, &spec, "--help").out, "the base learning rate: the train block's schedule cosine(eta_min=0.001), warmup 4 steps sets every step's rate from it")
	oc := spec
	oc.Schedule = schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.25}
	assert.Contains(t, run(t, &oc, "--help").out, "the peak learning rate, onecycle's max_lr")
	r = run(t, &oc, "--data", root, "--epochs", "1", "--quiet") // 3 steps: pct_start 0.25 of 4 would be one step; 3 steps are fine
	require.Equal(t, 0, r.code, r.err)
	r = run(t, &oc, "--data", root, "--epochs", "1", "--batch", "3", "--quiet") // 4 steps
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.err, "learning-rate schedule: onecycle: pct_start 0.25 of 4 steps is one step")
}

// --keep-best writes the best epoch's checkpoint (by test accuracy or
// loss), --patience stops a run whose metric no longer improves, and a
// resumed run carries on counting from the checkpoint's state.
func TestKeepBestAndPatience(t *testing.T) {
	spec, root := tiny(t)
	dir := t.TempDir()
	ck, best, log := filepath.Join(dir, "ck.safetensors"), filepath.Join(dir, "best.safetensors"), filepath.Join(dir, "log.jsonl")
	r := run(t, spec, "--data", root, "--test", root, "--epochs", "4", "--checkpoint", ck, "--keep-best", best, "--log", log, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	_, epochs := readLog(t, log)
	require.Len(t, epochs, 4)
	bestEpoch, bestAcc := 0, -1.0
	for _, e := range epochs {
		assert.Equal(t, e.TestAcc > bestAcc, e.Best, "epoch %d", e.Epoch)
		if e.TestAcc > bestAcc {
			bestEpoch, bestAcc = e.Epoch, e.TestAcc
		}
	}
	meta := readMeta(t, best)
	assert.Equal(t, "accuracy", meta["best_by"])
	assert.Equal(t, strconv.Itoa(bestEpoch), meta["best_epoch"])
	assert.Equal(t, strconv.Itoa(3*bestEpoch), meta["step"], "the best epoch's parameters")
	assert.Equal(t, strconv.Itoa(bestEpoch), meta["best_epoch"])
	assert.Equal(t, strconv.Itoa(bestEpoch), readMeta(t, ck)["best_epoch"], "the checkpoint carries the state")
	assert.Contains(t, r.out, "(best so far: written to "+best+")")

	// a rate of 1e-30 leaves the parameters as they are: the test loss
	// ties the first epoch's, and patience 2 stops the run after epoch 3
	r = run(t, spec, "--data", root, "--test", root, "--epochs", "10", "--lr", "1e-30", "--keep-best-by", "loss", "--patience", "2", "--max-steps", "6", "--checkpoint", ck, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, "2", readMeta(t, ck)["epoch"])
	r = run(t, spec, "--data", root, "--test", root, "--keep-best-by", "loss", "--patience", "2", "--resume", ck, "--checkpoint", ck, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "best so far: test loss ")
	assert.Contains(t, r.out, " at epoch 1 (1 epochs since)")
	assert.Contains(t, r.out, "epoch 3/10: ")
	assert.NotContains(t, r.out, "epoch 4/10")
	assert.Contains(t, r.out, "stopped early: the test loss has not improved for 2 epochs (--patience 2); the best is test loss ")
	r = run(t, spec, "--data", root, "--test", root, "--keep-best-by", "loss", "--patience", "2", "--resume", ck, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "nothing to train: stopped early")
	r = run(t, spec, "--data", root, "--test", root, "--patience", "2", "--resume", ck, "--epochs", "4", "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "--keep-best-by accuracy: the checkpoint's run followed the test loss; the best epoch is chosen afresh from here")
	r = run(t, spec, "--data", root, "--test", root, "--resume", ck, "--epochs", "4", "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "the checkpoint's run followed the test loss (--keep-best, --patience); this run does not, so checkpoints it writes forget the best epoch")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--keep-best", best}, "--keep-best needs --test: the best epoch is the one with the best test accuracy"},
		{[]string{"--patience", "3"}, "--patience needs --test"},
		{[]string{"--test", root, "--patience", "-1"}, "--patience -1: want 0 (never stop early) or more epochs"},
		{[]string{"--test", root, "--keep-best", best, "--keep-best-by", "acc"}, `--keep-best-by "acc": the best epoch is chosen by accuracy or loss`},
		{[]string{"--test", root, "--keep-best", ck, "--checkpoint", ck}, "--keep-best " + ck + " is the --checkpoint: give the best epoch a file of its own"},
		{[]string{"--keep-best-by", "loss"}, "--keep-best-by chooses the best epoch for --keep-best or --patience"},
	} {
		r := run(t, spec, append([]string{"--data", root, "--quiet"}, c.args...)...)
		assert.Equal(t, 2, r.code, "%v: %s", c.args, r.err)
		assert.Contains(t, r.err, c.want, "%v", c.args)
	}
}

// predict prints each file's top classes with the ImageFolder's class
// names from the checkpoint; a folder stands for its images; bad files
// are named, skipped, and make the exit status 1.
func TestPredict(t *testing.T) {
	spec, root := tiny(t)
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck.safetensors")
	r := run(t, spec, "--data", root, "--epochs", "3", "--checkpoint", ck, "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, `["class0","class1","class2"]`, readMeta(t, ck)["classes"])

	one := filepath.Join(root, "class1", "0001.png")
	r = run(t, spec, "predict", "--checkpoint", ck, "--top", "2", one)
	require.Equal(t, 0, r.code, r.err)
	assert.Regexp(t, `^`+regexp.QuoteMeta(one)+`: class\d \(\d+\.\d\d%\), class\d \(\d+\.\d\d%\)\n$`, r.out)

	// the predictions are the trainer's: the same classes Model.Predict gives
	// on the folder's own pixels
	notes := filepath.Join(dir, "notes.png")
	require.NoError(t, os.WriteFile(notes, []byte("not an image"), 0o644))
	r = run(t, spec, "predict", "--checkpoint", ck, "--json", "--top", "1", filepath.Join(root, "class2"), notes, filepath.Join(dir, "missing.png"))
	assert.Equal(t, 1, r.code)
	var got []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(r.out), "\n") {
		var x map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &x), l)
		got = append(got, x)
	}
	require.Len(t, got, 4+2, "class2's 4 images, then the 2 bad files")
	assert.Equal(t, filepath.Join(root, "class2", "0002.png"), got[0]["file"])
	assert.Contains(t, got[4]["error"], notes+": ")
	assert.Contains(t, got[5]["error"], "missing.png: no such file")
	assert.Contains(t, r.err, "predict: skipped "+notes+": ")
	assert.Contains(t, r.err, "2 of 6 files could not be read: "+notes+", "+filepath.Join(dir, "missing.png"))

	m := trainertest.Tiny(t)
	mod, err := trainer.NewModel(m.Spec, m.Backends, trainer.Options{})
	require.NoError(t, err)
	defer mod.Close()
	f, err := os.Open(ck)
	require.NoError(t, err)
	require.NoError(t, mod.Load(f))
	f.Close()
	ds := trainertest.Data(m.Spec, 12, 1) // the images WriteImageFolder wrote
	for i := 0; i < 4; i++ {
		top, err := mod.Predict(ds.Images[3*i+2], 1)
		require.NoError(t, err)
		entry := got[i]["top"].([]any)[0].(map[string]any)
		assert.Equal(t, float64(top[0][0].Class), entry["class"], "image %d", i)
		assert.Equal(t, top[0][0].Name, entry["name"])
		assert.InDelta(t, top[0][0].Prob, entry["probability"], 1e-15)
	}

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	r = run(t, spec, "predict", "--checkpoint", ck, empty)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.err, empty+": no image files in this folder")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"predict", "--checkpoint", ck}, "give the image files or folders to predict"},
		{[]string{"predict", one}, "--checkpoint is needed"},
		{[]string{"predict", "--checkpoint", ck, "--top", "4", one}, "--top 4: want 1 to 3"},
		{[]string{"predict", "--chekpoint", ck, one}, "unknown flag --chekpoint (did you mean --checkpoint?)"},
		{[]string{"predict", "--checkpoint", ck, "--device", "cuda", one}, "--device cuda: this trainer was built without it"},
	} {
		r := run(t, spec, c.args...)
		assert.Equal(t, 2, r.code, "%v: %s", c.args, r.err)
		assert.Contains(t, r.err, c.want, "%v", c.args)
		assert.True(t, strings.HasSuffix(r.err, "; see cli.test predict --help\n"), "%v: one line, then where help is: %q", c.args, r.err)
		assert.Equal(t, 1, strings.Count(r.err, "\n"), "%v", c.args)
	}
	r = run(t, spec, "predict", "--checkpoint", filepath.Join(dir, "nope.safetensors"), one)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.err, "--checkpoint: ")
	assert.Contains(t, run(t, spec, "predict", "--help").out, "exactly as the training")
	assert.Contains(t, run(t, spec, "predict", "-h").out, "help for predict")
	assert.Contains(t, run(t, spec, "--help").out, "predict --checkpoint CK IMAGE_OR_DIR...")
}
