package compiler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/dsl"
)

func TestAccumulateSetting(t *testing.T) {
	res, err := CompileSource("m.cnn", []byte(scheduleModel+"train {\n  batch = 16\n  accumulate = 4\n}\n"), Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(16), res.Train.Batch)
	assert.Equal(t, int64(4), res.Train.Accumulate)
	assert.Equal(t, int64(64), res.Train.StepBatch())
	assert.Equal(t, "batch 16, accumulate 4: 64 samples per update", res.Train.BatchWords())
	res, err = CompileSource("m.cnn", []byte(scheduleModel), Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), res.Train.Accumulate, "the default: one batch per update")
	assert.Equal(t, res.Train.Batch, res.Train.StepBatch())
	assert.Equal(t, "batch 32", res.Train.BatchWords())
}

func TestAccumulateErrors(t *testing.T) {
	bn := header + "  b = batchnorm2d(image)\n  f = linear(flatten(b), out=10)\n  loss = cross_entropy(f, label)\n}\n"
	for _, c := range []struct {
		model, train string
		batch        int64
		want         []string
	}{
		{scheduleModel, "accumulate = 0", 0, []string{"m.cnn:6:16: train block: accumulate must be at least 1, got 0"}},
		{scheduleModel, "accumulate = -2", 0, []string{"m.cnn:6:16: train block: accumulate must be at least 1, got -2"}},
		{scheduleModel, "accumulate = 2.5", 0, []string{"m.cnn:6:16: train block: accumulate must be an integer, got number 2.5"}},
		{scheduleModel, "accumulate = 2000000", 0, []string{"m.cnn:6:16: train block: accumulate must be at most 1,048,576, got 2,000,000"}},
		{scheduleModel, "batch = 4096; accumulate = 512", 0, []string{
			"m.cnn:6:30: accumulate = 512 with batch 4096 makes updates of 2,097,152 samples; cnnc compiles steps of at most 1,048,576 (2^20)",
			"at batch 4096, accumulate is at most 256"}},
		{scheduleModel, "accumulate = 512", 8192, []string{"m.cnn:6:16: accumulate = 512 with batch 8192", "the batch comes from --batch", "accumulate is at most 128"}},
		{bn, "accumulate = 2", 0, []string{"m.cnn:7:16: accumulate = 2 cannot train M: its batch norm b (m.cnn:2:7) normalises over the whole batch", "accumulate = 2\n                   ^\n"}},
	} {
		src := c.model + "train {\n  " + c.train + "\n}\n"
		_, err := CompileSource("m.cnn", []byte(src), Options{Batch: c.batch, BatchSource: "--batch"})
		require.Error(t, err, c.train)
		var ds dsl.Diagnostics
		require.ErrorAs(t, err, &ds)
		out := ds.RenderAll(map[string][]byte{"m.cnn": []byte(src)})
		for _, w := range c.want {
			assert.Contains(t, out, w, c.train)
		}
	}
}
