package compiler

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/schedule"
)

// TrainConfig is the train block with defaults filled in.
type TrainConfig struct {
	Optimizer    ir.Optimizer
	Batch        int64
	Epochs       int64
	MemoryBudget int64 // bytes; 0 means none
	Seed         uint64
	// Precision of the GEMM-shaped kernels: "fp32", "tf32" or "bf16"
	// (codegen.Precision); "" when the block leaves it out (fp32).
	Precision string
	// Schedule is the learning-rate schedule (schedule, warmup); with
	// onecycle, Optimizer.LR is its max_lr, the run's base rate.
	Schedule schedule.Schedule
	// Accumulate is the batches per optimizer update (the train block's
	// accumulate; 1 without it): a step trains on Batch×Accumulate samples,
	// planned as a micro-batch loop of Accumulate micro-batches of Batch.
	Accumulate int64
	// ClipGradNorm is the train block's clip_grad_norm: the largest global
	// L2 norm of all gradients before each update scales them down, as
	// torch.nn.utils.clip_grad_norm_(params, max_norm); 0 without it.
	ClipGradNorm float64
	// SMs is the SM count of the GPU the CUDA kernels' launch geometry is
	// sized for (codegen.Options.SMs): not a train-block setting — cnnc
	// plan --gpu sets it from compiler/perf's spec table; 0 is codegen's
	// default (an H100/H200's).
	SMs int64
	// Arch is the SASS architecture (sm_80, sm_90) of that GPU
	// (codegen.Options.Arch): set with SMs; "" when none is named.
	Arch string
	Pos  map[string]dsl.Pos // where each setting was written
}

// StepBatch is the samples one optimizer update trains on: the batch
// times the batches accumulated.
func (t TrainConfig) StepBatch() int64 { return t.Batch * max(t.Accumulate, 1) }

// BatchWords says the batch for people: "batch 32", or with accumulation
// "batch 32, accumulate 4: 128 samples per update".
func (t TrainConfig) BatchWords() string {
	if t.Accumulate > 1 {
		return fmt.Sprintf("batch %d, accumulate %d: %d samples per update", t.Batch, t.Accumulate, t.StepBatch())
	}
	return fmt.Sprintf("batch %d", t.Batch)
}

// DataSource is one dataset of the data block.
type DataSource struct {
	Pos    dsl.Pos
	Kind   string // "imagefolder" or "mnist"
	Path   string
	Resize [2]int64 // H, W
}

// DataConfig is the data block.
type DataConfig struct {
	Train, Test *DataSource
	// Augment is the augment list (nil: none), done by the first layer's
	// kernels while loading the batch; evaluation gets its deterministic
	// part (Spec.Eval). AugmentPos is where the list was written.
	Augment    *augment.Spec
	AugmentPos dsl.Pos
}

// Defaults used when the train block leaves a setting out.
const (
	DefaultBatch  = 32
	DefaultEpochs = 1
)

// MaxBatch is the largest batch cnnc compiles a training step for (its
// kernels' grids and the memory plan's sizes stay far within their
// limits); `cnnc plan --max-batch` searches up to it.
const MaxBatch = 1 << 20

// MaxEpochs bounds the train block's epochs.
const MaxEpochs = 1_000_000

var trainSettings = []argSpec{
	{Name: "optimizer", Kind: ops.ArgCustom, Doc: "sgd(...), adam(...) or adamw(...)"},
	{Name: "batch", Kind: ops.ArgInt, Min: 1, MaxInt: MaxBatch, MaxWhy: "cnnc compiles training steps of at most 1,048,576 samples (2^20)", Doc: "samples per step (default 32)"},
	{Name: "epochs", Kind: ops.ArgInt, Min: 1, MaxInt: MaxEpochs, MaxWhy: "a run of more epochs is better split over several (--resume)", Doc: "passes over the training data (default 1)"},
	{Name: "memory_budget", Kind: ops.ArgSize, Doc: "device memory the step may use, e.g. 64MiB"},
	{Name: "seed", Kind: ops.ArgInt, Min: 0, Doc: "seed for initialisation, shuffling and dropout (default 0)"},
	{Name: "schedule", Kind: ops.ArgCustom, Doc: "learning-rate schedule: step(...), multistep(...), cosine(...) or onecycle(...)"},
	{Name: "warmup", Kind: ops.ArgInt, Min: 1, Doc: "steps of linear warmup before the schedule"},
	{Name: "accumulate", Kind: ops.ArgInt, Min: 1, MaxInt: MaxBatch, MaxWhy: "an update trains on at most 1,048,576 samples (2^20)", Doc: "batches per optimizer update: gradient accumulation (default 1)"},
	{Name: "clip_grad_norm", Kind: ops.ArgFloat, Positive: true, Doc: "clip the global L2 norm of all gradients to this before each update (torch.nn.utils.clip_grad_norm_)"},
	{Name: "precision", Kind: ops.ArgCustom, Doc: "fp32, tf32 or bf16: how convolutions and linear layers multiply (tensor cores for tf32, bf16; default fp32)"},
}

// precisions are the values of the train block's precision setting.
var precisions = []string{"fp32", "tf32", "bf16"}

// ParseTrain reads the train block (nil gives the defaults).
func ParseTrain(s *dsl.Section) (TrainConfig, dsl.Diagnostics) {
	cfg := TrainConfig{
		Optimizer:  ir.Optimizer{Kind: ir.SGD, LR: 0.01},
		Batch:      DefaultBatch,
		Epochs:     DefaultEpochs,
		Accumulate: 1,
		Pos:        map[string]dsl.Pos{},
	}
	var diags dsl.Diagnostics
	if s == nil {
		return cfg, nil
	}
	vals := settingsArgs("train", s, trainSettings, &diags)
	for k, e := range vals {
		cfg.Pos[k] = e.Pos
	}
	if e := vals["optimizer"]; e != nil {
		if opt, ok := parseOptimizer(e, &diags); ok {
			cfg.Optimizer = opt
		}
	}
	cfg.Batch = vals.Int("batch", DefaultBatch)
	cfg.Epochs = vals.Int("epochs", DefaultEpochs)
	cfg.Seed = uint64(vals.Int("seed", 0))
	cfg.Accumulate = vals.Int("accumulate", 1)
	cfg.ClipGradNorm = vals.Float("clip_grad_norm", 0)
	var maxLR float64
	if cfg.Schedule, maxLR = parseSchedule(vals["schedule"], vals["warmup"], &diags); maxLR > 0 {
		cfg.Optimizer.LR = maxLR
		warnUnusedLR(vals["optimizer"], maxLR, &diags)
	}
	if e := vals["precision"]; e != nil {
		if e.Kind == dsl.ExprIdent && slices.Contains(precisions, e.Ident) {
			cfg.Precision = e.Ident
		} else {
			diags = append(diags, dsl.Errorf(e.Pos, "train block: precision must be fp32, tf32 or bf16, got %s", describe(e)).Span(exprSpan(e)))
		}
	}
	if e := vals["memory_budget"]; e != nil {
		cfg.MemoryBudget = e.Size
		if e.Size <= 0 {
			diags = append(diags, dsl.Errorf(e.Pos, "memory_budget must be positive").Span(exprSpan(e)))
		}
	}
	return cfg, diags
}

func parseOptimizer(e *dsl.Expr, diags *dsl.Diagnostics) (ir.Optimizer, bool) {
	if e.Kind != dsl.ExprCall {
		*diags = append(*diags, dsl.Errorf(e.Pos, "optimizer must be a call such as sgd(lr=0.01, momentum=0.9), got %s", describe(e)).Span(exprSpan(e)))
		return ir.Optimizer{}, false
	}
	c := e.Call
	def := ops.OptimizerByName(c.Name)
	if def == nil {
		var names []string
		for _, o := range ops.Optimizers() {
			names = append(names, o.Name)
		}
		d := dsl.Errorf(c.Pos, "unknown optimizer %s", c.Name).Span(len(c.Name))
		if s := suggest(c.Name, names); s != "" {
			d.Hint("did you mean %s?", s)
		} else {
			d.Hint("optimizers: %s", strings.Join(names, ", "))
		}
		*diags = append(*diags, d)
		return ir.Optimizer{}, false
	}
	if p := c.Positional(); len(p) > 0 {
		*diags = append(*diags, dsl.Errorf(p[0].Pos, "%s takes keyword arguments only (lr=..., ...)", c.Name))
		return ir.Optimizer{}, false
	}
	before := len(*diags)
	a := checkArgs(c.Name, c, def.Args, diags)
	if len(*diags) > before {
		return ir.Optimizer{}, false
	}
	o, err := def.Make(a)
	if err != nil {
		*diags = append(*diags, argDiagnostic(c, a, err))
		return o, false
	}
	return o, true
}

// settingsArgs checks the `key = value` statements of a block like keyword
// arguments of a call.
func settingsArgs(block string, s *dsl.Section, specs []argSpec, diags *dsl.Diagnostics) args {
	call := &dsl.Call{Pos: s.Pos, Name: block}
	for _, st := range s.Stmts {
		call.Args = append(call.Args, &dsl.Arg{Pos: st.Pos, Key: st.Name, Value: st.Value})
	}
	return checkArgs(block+" block", call, specs, diags)
}

var dataSettings = []argSpec{
	{Name: "train", Kind: ops.ArgCustom, Required: true, Doc: "the training set, e.g. imagefolder(\"data/train\")"},
	{Name: "test", Kind: ops.ArgCustom, Doc: "the test set"},
	{Name: "augment", Kind: ops.ArgCustom, Doc: "training-time augmentation: a list of random_crop(...), random_resized_crop(...), hflip(...), normalize(...)"},
}

var datasetArgs = map[string][]argSpec{
	"imagefolder": {{Name: "resize", Kind: ops.ArgIntPair, Min: 1, Doc: "[H, W] the loader resizes to (default: the model's input)"}},
	"mnist":       {},
}

// ParseData reads the data block (nil: no data configured) and checks
// each dataset against the model's image and label types (when known).
func ParseData(s *dsl.Section, image, label ir.Type) (DataConfig, dsl.Diagnostics) {
	var cfg DataConfig
	var diags dsl.Diagnostics
	if s == nil {
		return cfg, nil
	}
	vals := settingsArgs("data", s, dataSettings, &diags)
	crop := augmentCrops(vals["augment"])
	for _, key := range []string{"train", "test"} {
		e := vals[key]
		if e == nil {
			continue
		}
		ds := parseDataset(e, image, label, crop, &diags)
		if key == "train" {
			cfg.Train = ds
		} else {
			cfg.Test = ds
		}
	}
	if tr, te := cfg.Train, cfg.Test; crop && tr != nil && te != nil && tr.Resize != te.Resize {
		diags = append(diags, dsl.Errorf(te.Pos, "the test images are %dx%d but the training images %dx%d: with a crop in augment both sets are loaded at one size (the crop's input)", te.Resize[0], te.Resize[1], tr.Resize[0], tr.Resize[1]).Span(len(te.Kind)))
	}
	if e := vals["augment"]; e != nil && cfg.Train != nil && image.IsKnown() && len(image.Dims) == 3 {
		raw := [3]int64{cfg.Train.Resize[0], cfg.Train.Resize[1], image.Dims[0]}
		cfg.Augment, cfg.AugmentPos = parseAugment(e, raw, image, &diags), e.Pos
	}
	return cfg, diags
}

// augmentCrops reports whether an augment list has a crop step: the
// images are then loaded at the crop's input size, not the model's.
func augmentCrops(e *dsl.Expr) bool {
	if e == nil || e.Kind != dsl.ExprList {
		return false
	}
	for _, x := range e.List {
		if x.Kind == dsl.ExprCall {
			if k := augment.Names[x.Call.Name]; k == augment.RandomCrop || k == augment.RandomResizedCrop {
				return true
			}
		}
	}
	return false
}

// MNISTClasses is the number of MNIST's labels, the digits 0..9.
const MNISTClasses = 10

// With crop (the augment list crops), an imagefolder's resize is the
// crop's input, any size, and mnist's images need only one channel.
func parseDataset(e *dsl.Expr, image, label ir.Type, crop bool, diags *dsl.Diagnostics) *DataSource {
	if e.Kind != dsl.ExprCall {
		*diags = append(*diags, dsl.Errorf(e.Pos, "a dataset is imagefolder(\"path\") or mnist(\"path\"), got %s", describe(e)).Span(exprSpan(e)))
		return nil
	}
	c := e.Call
	specs, ok := datasetArgs[c.Name]
	if !ok {
		d := dsl.Errorf(c.Pos, "unknown dataset kind %s", c.Name).Span(len(c.Name))
		names := []string{"imagefolder", "mnist"}
		if s := suggest(c.Name, names); s != "" {
			d.Hint("did you mean %s?", s)
		} else {
			d.Hint("datasets: %s", strings.Join(names, ", "))
		}
		*diags = append(*diags, d)
		return nil
	}
	pos := c.Positional()
	if len(pos) != 1 || pos[0].Value.Kind != dsl.ExprString {
		*diags = append(*diags, dsl.Errorf(c.Pos, "%s takes the dataset's path as a string first, e.g. %s(\"data/train\")", c.Name, c.Name).Span(len(c.Name)))
		return nil
	}
	a := checkArgs(c.Name, c, specs, diags)
	ds := &DataSource{Pos: c.Pos, Kind: c.Name, Path: pos[0].Value.String}
	if image.IsKnown() && len(image.Dims) == 3 {
		ds.Resize = [2]int64{image.Dims[1], image.Dims[2]}
		if c.Name == "mnist" {
			ds.Resize = [2]int64{28, 28}
		}
		if r := a["resize"]; r != nil && crop {
			ds.Resize = a.Pair("resize", 0)
		} else if r != nil {
			got := a.Pair("resize", 0)
			if got != ds.Resize {
				*diags = append(*diags, dsl.Errorf(r.Pos, "%s resizes to %dx%d but the model's input is %dx%d", c.Name, got[0], got[1], ds.Resize[0], ds.Resize[1]).Span(exprSpan(r)))
			}
		}
		if c.Name == "mnist" && crop && image.Dims[0] != 1 {
			*diags = append(*diags, dsl.Errorf(c.Pos, "mnist images have 1 channel but the model's input is %s", image.DimsString()).Span(len(c.Name)))
		} else if c.Name == "mnist" && !crop && (image.Dims[0] != 1 || image.Dims[1] != 28 || image.Dims[2] != 28) {
			*diags = append(*diags, dsl.Errorf(c.Pos, "mnist images are 1x28x28 but the model's input is %s", image.DimsString()).Span(len(c.Name)))
		}
	}
	if c.Name == "mnist" && label.DType == ir.Class && label.Classes < MNISTClasses {
		*diags = append(*diags, dsl.Errorf(c.Pos, "mnist has %d classes (the digits 0 to 9) but the model's labels are class[%d]", MNISTClasses, label.Classes).Span(len(c.Name)).
			Hint("declare label: class[10] and give the last layer out=10"))
	}
	return ds
}
