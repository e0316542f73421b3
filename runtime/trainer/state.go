package trainer

import (
	"fmt"
	"math"
	"strconv"
)

// Metadata keys of a run's state in checkpoints (see RunState).
const (
	metaEpoch     = "epoch"       // epoch in progress, from 0
	metaBatch     = "epoch_batch" // batches of it already done
	metaShuf      = "no_shuffle"
	metaBatchSize = "batch_size"
	metaEpochs    = "epochs"        // the run's planned epochs
	metaSamples   = "train_samples" // training samples, for checking a resumed run's data
)

// RunState is what a checkpoint carries besides the session's step, seed
// and learning rate, so that a resumed run continues the same run: where
// it is, and the settings that fix its data order.
type RunState struct {
	Position
	Epochs    int
	Batch     int  // samples per step
	NoShuffle bool // the data was read in order
	Samples   int  // training samples (0: unknown)
	// Has says which fields the checkpoint held (by metadata key).
	Has map[string]bool
}

// Meta is the state as checkpoint metadata.
func (r RunState) Meta() map[string]string {
	m := map[string]string{
		metaEpoch: strconv.Itoa(r.Epoch), metaBatch: strconv.Itoa(r.Position.Batch),
		metaShuf: strconv.FormatBool(r.NoShuffle), metaBatchSize: strconv.Itoa(r.Batch),
		metaEpochs: strconv.Itoa(r.Epochs),
	}
	if r.Samples > 0 {
		m[metaSamples] = strconv.Itoa(r.Samples)
	}
	return m
}

// HasPosition says whether the checkpoint said where its run was (a
// trainer's --checkpoint does; a package's Save after Step calls need not).
func (r RunState) HasPosition() bool { return r.Has[metaEpoch] }

// ParseRunState reads a run's state from checkpoint metadata. Missing
// fields stay zero; a present one must be well-formed (counts not
// negative), or the error names it.
func ParseRunState(meta map[string]string) (RunState, error) {
	r := RunState{Has: map[string]bool{}}
	ints := []struct {
		key string
		dst *int
		min int
	}{
		{metaEpoch, &r.Epoch, 0}, {metaBatch, &r.Position.Batch, 0}, {metaBatchSize, &r.Batch, 1},
		{metaEpochs, &r.Epochs, 0}, {metaSamples, &r.Samples, 1},
	}
	for _, f := range ints {
		s, ok := meta[f.key]
		if !ok {
			continue
		}
		v, err := strconv.Atoi(s)
		if err != nil || v < f.min {
			return r, fmt.Errorf("metadata %q = %q is not a count of at least %d", f.key, s, f.min)
		}
		*f.dst = v
		r.Has[f.key] = true
	}
	if s, ok := meta[metaShuf]; ok {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return r, fmt.Errorf("metadata %q = %q is not true or false", metaShuf, s)
		}
		r.NoShuffle, r.Has[metaShuf] = b, true
	}
	if r.Has[metaEpoch] != r.Has[metaBatch] {
		return r, fmt.Errorf("metadata has one of %q and %q without the other", metaEpoch, metaBatch)
	}
	return r, nil
}

// Check compares the state with the step count the checkpoint holds and
// the data it is resumed on (samples, and batches per epoch at r.Batch):
// the position must lie inside an epoch, and the steps must be those of
// Epoch epochs and Batch batches. Anything else means another dataset or
// a damaged checkpoint, which cannot resume exactly.
func (r RunState) Check(step int64, samples, perEpoch int) error {
	if r.Samples > 0 && r.Samples != samples {
		return fmt.Errorf("it was trained on %d samples and the data has %d: resume on the same data, or start a new run from its parameters with --init", r.Samples, samples)
	}
	if r.Position.Batch >= perEpoch {
		return fmt.Errorf("it is at batch %d of epoch %d, but an epoch of this data has %d batches", r.Position.Batch, r.Epoch+1, perEpoch)
	}
	if want := int64(r.Epoch)*int64(perEpoch) + int64(r.Position.Batch); step != want {
		return fmt.Errorf("its step count %d does not match its position (epoch %d after batch %d at %d batches per epoch is step %d)", step, r.Epoch+1, r.Position.Batch, perEpoch, want)
	}
	return nil
}

// LR32 is a learning rate as the float32 the kernels compute with. It
// refuses what float32 cannot hold: a rate that is not a positive
// number, one above float32's largest, and one below its smallest normal
// number (1.2e-38), which would be stored as 0 or lose its digits.
func LR32(lr float64) (float32, error) {
	switch {
	case math.IsNaN(lr) || lr <= 0:
		return 0, fmt.Errorf("the learning rate must be a positive number, got %v", lr)
	case lr > math.MaxFloat32:
		return 0, fmt.Errorf("the learning rate %v is above float32's largest number (%.4g), which the kernels compute with", lr, math.MaxFloat32)
	case lr < math.SmallestNonzeroFloat32*(1<<23):
		return 0, fmt.Errorf("the learning rate %v is below float32's smallest normal number (%.4g), which the kernels compute with", lr, math.SmallestNonzeroFloat32*(1<<23))
	}
	return float32(lr), nil
}
