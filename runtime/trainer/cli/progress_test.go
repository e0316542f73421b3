package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/cnnc/cnnc/runtime/trainer"
)

// Off a terminal, progress is one line per interval, not a redrawn bar.
func TestProgressLinesOffATerminal(t *testing.T) {
	var w bytes.Buffer
	clock := time.Unix(0, 0)
	p := newProgress(&w, false, 10*time.Second, 2, 100)
	p.now = func() time.Time { return clock }
	for i := 0; i < 100; i++ {
		clock = clock.Add(time.Second) // a step a second: a line every 10 steps
		p.step(&trainer.StepMetrics{Step: int64(i + 1), Epoch: 1, Batch: i, Loss: 0.5, Size: 8})
	}
	p.done()
	// the epoch's clock starts at its first step: lines after steps 11, 21, ..., 91
	got := strings.Split(strings.TrimSuffix(w.String(), "\n"), "\n")
	assert.Len(t, got, 9)
	assert.Equal(t, "epoch 1/2 loss 0.5000 9 img/s, batch 11/100", got[0]) // 88 images in 10 s
	assert.Equal(t, "epoch 1/2 loss 0.5000 8 img/s, batch 91/100", got[8]) // 728 images in 90 s
	assert.NotContains(t, w.String(), "\r")

	w.Reset()
	p = newProgress(nil, false, 0, 2, 100) // --quiet
	p.step(&trainer.StepMetrics{Epoch: 1, Size: 8})
	assert.Empty(t, w.String())
}
