package trainergen_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// The tests whose subject is the trainer (sessions, checkpoints, schedules, micro-batching, data
// loading, the checkpoint's layout in PyTorch) run it on the CPU target, as `cnnc build` does by
// default: its kernels compiled with g++ once per model (runtime/native's cache) and run
// vectorised on every core — minutes faster than the generated CUDA C on the emulator. A model
// with a layer the CPU target has no kernels for yet runs on the emulator instead. The tests whose
// subject is the CUDA kernels (TestCPUTrainerMatchesTheReference, TestCheckpointInPyTorch's
// float32 bounds, the fatbin and CUDA module tests) compile for CUDA (compileExample) and run on
// the emulator, the kernels' oracle.

// targets records which target each Compiled of compileTrainer was compiled for, so that
// newSession opens it on the right device (a Compiled from driver.Compile directly is CUDA C).
var targets sync.Map // *trainergen.Compiled -> driver.Target

// compileTrainer plans and generates res (cfg: the planner's budget) for the CPU target, or for
// the emulator when the CPU target refuses one of its layers (a *codegen.NoRuleError).
func compileTrainer(t testing.TB, res *compiler.Result, cfg plan.Config) *trainergen.Compiled {
	t.Helper()
	target := driver.CPU
	c, err := driver.Compile(res, cfg, target)
	var nr *codegen.NoRuleError
	if errors.As(err, &nr) && nr.Target != "" {
		t.Logf("%s: the CPU target refuses it (%v): on the CUDA emulator", res.Graph.Name, err)
		target = driver.Emu
		c, err = driver.Compile(res, cfg, target)
	}
	require.NoError(t, err)
	targets.Store(c, target)
	return c
}

// compileTrainerExample is compileTrainer of an example model file at batch (0: its train block's).
func compileTrainerExample(t testing.TB, path string, batch int64) *trainergen.Compiled {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(checkoutName(path), src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	return compileTrainer(t, res, plan.Config{})
}

// checkoutName is path relative to the package folder where it can be: the
// source's name is in every generated file, and the device and nvcc caches
// serve the same text, so a name that is the same in every checkout (not
// moduleRoot's absolute path) compiles a model once for all of them.
func checkoutName(path string) string {
	wd, err := os.Getwd()
	if err != nil || !filepath.IsAbs(path) {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil {
		return rel
	}
	return path
}

// openDevice opens c's kernels on the device of the target it was compiled for: runtime/native
// for the CPU target, else the CUDA emulator.
func openDevice(t testing.TB, c *trainergen.Compiled) device.Device {
	t.Helper()
	var dev device.Device
	var err error
	if targetOf(c) == driver.CPU {
		dev, err = native.New(c.Kernels, "kernels.cc", native.Options{})
	} else {
		dev, err = cpu.New(c.Kernels, "kernels.cu", cpu.Options{})
	}
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	return dev
}

// newSession is a training session of c, its parameters initialised from seed.
func newSession(t testing.TB, c *trainergen.Compiled, seed uint64) *trainer.Session {
	t.Helper()
	s, err := trainer.NewSession(c.Spec, openDevice(t, c), seed)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// compileTrainerSrc is compileTrainer of a model's text (d.cnn).
func compileTrainerSrc(t testing.TB, src string) *trainergen.Compiled {
	t.Helper()
	res, err := compiler.CompileSource("d.cnn", []byte(src), compiler.Options{})
	require.NoError(t, err)
	return compileTrainer(t, res, plan.Config{})
}

// targetOf is the target c was compiled for by compileTrainer (CUDA for any other Compiled).
func targetOf(c *trainergen.Compiled) driver.Target {
	if tg, ok := targets.Load(c); ok {
		return tg.(driver.Target)
	}
	return driver.CUDA
}
