package compiler

import (
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
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
	// Schedule is the learning-rate schedule (schedule, warmup); with
	// onecycle, Optimizer.LR is its max_lr, the run's base rate.
	Schedule schedule.Schedule
	Pos      map[string]dsl.Pos // where each setting was written
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
	{name: "optimizer", doc: "sgd(...), adam(...) or adamw(...)"},
	{name: "batch", kind: argInt, min: 1, maxInt: MaxBatch, maxWhy: "cnnc compiles training steps of at most 1,048,576 samples (2^20)", doc: "samples per step (default 32)"},
	{name: "epochs", kind: argInt, min: 1, maxInt: MaxEpochs, maxWhy: "a run of more epochs is better split over several (--resume)", doc: "passes over the training data (default 1)"},
	{name: "memory_budget", kind: argSize, doc: "device memory the step may use, e.g. 64MiB"},
	{name: "seed", kind: argInt, min: 0, doc: "seed for initialisation, shuffling and dropout (default 0)"},
	{name: "schedule", kind: -1, doc: "learning-rate schedule: step(...), multistep(...), cosine(...) or onecycle(...)"},
	{name: "warmup", kind: argInt, min: 1, doc: "steps of linear warmup before the schedule"},
}

type optimizerDef struct {
	kind ir.OptimizerKind
	args []argSpec
	lr   float64
	wd   float64
}

var optimizerDefs = map[string]optimizerDef{
	"sgd": {kind: ir.SGD, lr: 0.01, args: []argSpec{
		{name: "lr", kind: argFloat, positive: true, doc: "learning rate (default 0.01)"},
		{name: "momentum", kind: argFloat, min: 0, doc: "momentum factor (default 0)"},
		{name: "nesterov", kind: argBool, doc: "Nesterov momentum (default false)"},
		{name: "weight_decay", kind: argFloat, min: 0, doc: "L2 penalty (default 0)"},
	}},
	"adam":  {kind: ir.Adam, lr: 0.001, args: adamArgs},
	"adamw": {kind: ir.AdamW, lr: 0.001, wd: 0.01, args: adamArgs},
}

var adamArgs = []argSpec{
	{name: "lr", kind: argFloat, positive: true, doc: "learning rate (default 0.001)"},
	{name: "betas", kind: argFloatPair, min: 0, max: 1, doc: "moment decay rates (default [0.9, 0.999])"},
	{name: "eps", kind: argFloat, min: 0, doc: "added to the denominator (default 1e-8)"},
	{name: "weight_decay", kind: argFloat, min: 0, doc: "L2 penalty for adam, decoupled decay for adamw (defaults 0 and 0.01)"},
}

// ParseTrain reads the train block (nil gives the defaults).
func ParseTrain(s *dsl.Section) (TrainConfig, dsl.Diagnostics) {
	cfg := TrainConfig{
		Optimizer: ir.Optimizer{Kind: ir.SGD, LR: 0.01},
		Batch:     DefaultBatch,
		Epochs:    DefaultEpochs,
		Pos:       map[string]dsl.Pos{},
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
	cfg.Batch = vals.int("batch", DefaultBatch)
	cfg.Epochs = vals.int("epochs", DefaultEpochs)
	cfg.Seed = uint64(vals.int("seed", 0))
	var maxLR float64
	if cfg.Schedule, maxLR = parseSchedule(vals["schedule"], vals["warmup"], &diags); maxLR > 0 {
		cfg.Optimizer.LR = maxLR
		warnUnusedLR(vals["optimizer"], maxLR, &diags)
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
	def, ok := optimizerDefs[c.Name]
	if !ok {
		d := dsl.Errorf(c.Pos, "unknown optimizer %s", c.Name).Span(len(c.Name))
		if s := suggest(c.Name, []string{"sgd", "adam", "adamw"}); s != "" {
			d.Hint("did you mean %s?", s)
		} else {
			d.Hint("optimizers: sgd, adam, adamw")
		}
		*diags = append(*diags, d)
		return ir.Optimizer{}, false
	}
	if p := c.Positional(); len(p) > 0 {
		*diags = append(*diags, dsl.Errorf(p[0].Pos, "%s takes keyword arguments only (lr=..., ...)", c.Name))
		return ir.Optimizer{}, false
	}
	before := len(*diags)
	a := checkArgs(c.Name, c, def.args, diags)
	if len(*diags) > before {
		return ir.Optimizer{}, false
	}
	o := ir.Optimizer{Kind: def.kind, LR: a.float("lr", def.lr), WeightDecay: a.float("weight_decay", def.wd)}
	switch def.kind {
	case ir.SGD:
		o.Momentum = a.float("momentum", 0)
		o.Nesterov = a.bool("nesterov", false)
		if o.Nesterov && o.Momentum == 0 {
			*diags = append(*diags, dsl.Errorf(c.Pos, "sgd: nesterov=true needs a momentum above 0").Span(len(c.Name)))
			return o, false
		}
	default:
		o.Beta1, o.Beta2, o.Eps = 0.9, 0.999, 1e-8
		if b := a["betas"]; b != nil {
			o.Beta1, o.Beta2 = numberOf(b.List[0]), numberOf(b.List[1])
		}
		o.Eps = a.float("eps", 1e-8)
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
	plain := make([]argSpec, len(specs))
	copy(plain, specs)
	for i := range plain {
		if plain[i].name == "optimizer" {
			plain[i].kind = -1 // checked by parseOptimizer
		}
	}
	return checkArgs(block+" block", call, plain, diags)
}

var dataSettings = []argSpec{
	{name: "train", kind: -1, required: true, doc: "the training set, e.g. imagefolder(\"data/train\")"},
	{name: "test", kind: -1, doc: "the test set"},
}

var datasetArgs = map[string][]argSpec{
	"imagefolder": {{name: "resize", kind: argIntPair, min: 1, doc: "[H, W] the loader resizes to (default: the model's input)"}},
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
	for _, key := range []string{"train", "test"} {
		e := vals[key]
		if e == nil {
			continue
		}
		ds := parseDataset(e, image, label, &diags)
		if key == "train" {
			cfg.Train = ds
		} else {
			cfg.Test = ds
		}
	}
	return cfg, diags
}

// MNISTClasses is the number of MNIST's labels, the digits 0..9.
const MNISTClasses = 10

func parseDataset(e *dsl.Expr, image, label ir.Type, diags *dsl.Diagnostics) *DataSource {
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
		if r := a["resize"]; r != nil {
			got := a.pair("resize", 0)
			if got != ds.Resize {
				*diags = append(*diags, dsl.Errorf(r.Pos, "%s resizes to %dx%d but the model's input is %dx%d", c.Name, got[0], got[1], ds.Resize[0], ds.Resize[1]).Span(exprSpan(r)))
			}
		}
		if c.Name == "mnist" && (image.Dims[0] != 1 || image.Dims[1] != 28 || image.Dims[2] != 28) {
			*diags = append(*diags, dsl.Errorf(c.Pos, "mnist images are 1x28x28 but the model's input is %s", image.DimsString()).Span(len(c.Name)))
		}
	}
	if c.Name == "mnist" && label.DType == ir.Class && label.Classes < MNISTClasses {
		*diags = append(*diags, dsl.Errorf(c.Pos, "mnist has %d classes (the digits 0 to 9) but the model's labels are class[%d]", MNISTClasses, label.Classes).Span(len(c.Name)).
			Hint("declare label: class[10] and give the last layer out=10"))
	}
	return ds
}
