package trainer_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// tinyAugmented is tiny.cnn loading 8x8 images and training on random 6x6 crops of them, padded,
// flipped and normalized (evaluation: the center crop, normalized).
func tinyAugmented(t *testing.T) *trainertest.Model {
	src := strings.Replace(string(trainertest.TinySource), `train = imagefolder("data/train", resize=[6,6])`,
		`train = imagefolder("data/train", resize=[8,8])
    augment = [random_crop(size=[6,6], padding=1), hflip(), normalize(mean=[0.5], std=[0.25])]`, 1)
	src = strings.Replace(src, "model Tiny(", "model TinyAug(", 1)
	require.Contains(t, src, "augment")
	return trainertest.Compile(t, "tiny_augmented.cnn", []byte(src))
}

// The augmentation's draws are a function of the run's seed, the step and the sample's place in
// the batch — which the loader's order makes a function of (seed, epoch, sample) — so a run
// interrupted, saved and resumed from its checkpoint in a new session ends with the parameters
// and optimizer state of the uninterrupted run, bit for bit; and the run's seed changes them.
func TestAugmentedRunResumesExactly(t *testing.T) {
	m := tinyAugmented(t)
	require.Equal(t, [3]int{8, 8, 1}, [3]int{m.Spec.H, m.Spec.W, m.Spec.C}, "the loader delivers the crop's input")
	ds := trainertest.Data(m.Spec, 12, 3)
	whole := m.Session(t, 2)
	loop, _ := newLoop(whole, ds, 2)
	_, err := loop.Run(context.Background())
	require.NoError(t, err)

	part := m.Session(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	loop, _ = newLoop(part, ds, 2)
	loop.OnStep = func(s *trainer.StepMetrics) error {
		if s.Step == 4 { // in the second epoch
			cancel()
		}
		return nil
	}
	res, err := loop.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, trainer.Interrupted, res.Stop)
	ckpt := filepath.Join(t.TempDir(), "aug.safetensors")
	require.NoError(t, part.Save(ckpt, nil))
	resumed := m.Session(t, 99)
	meta, err := resumed.Load(ckpt, true)
	require.NoError(t, err)
	require.Equal(t, "2", meta[trainer.MetaSeed])
	resumed.Seed = 2 // the run's seed, from the checkpoint, as --resume takes it
	assert.Equal(t, part.Step, resumed.Step)
	loop, _ = newLoop(resumed, ds, 2)
	loop.Start = res.At
	_, err = loop.Run(context.Background())
	require.NoError(t, err)
	sameState(t, whole, resumed)

	other := m.Session(t, 2)
	other.Seed = 5
	loop, _ = newLoop(other, ds, 2)
	_, err = loop.Run(context.Background())
	require.NoError(t, err)
	w, err := whole.ReadTensor(m.Spec.Params[0])
	require.NoError(t, err)
	o, err := other.ReadTensor(m.Spec.Params[0])
	require.NoError(t, err)
	assert.NotEqual(t, w, o, "another seed draws other crops and flips (and another order)")
}
