package trainer_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A Model trained on an ImageFolder names its predictions by the class
// folders, and so does one loaded from its checkpoint.
func TestModelNamesItsClasses(t *testing.T) {
	m := trainertest.Tiny(t)
	mem := trainertest.Data(m.Spec, 12, 1)
	root := filepath.Join(t.TempDir(), "images")
	trainertest.WriteImageFolder(t, root, mem)
	ds, err := data.OpenImageFolder(root, data.ImageFolderOptions{Shape: mem.Size, NoCache: true})
	require.NoError(t, err)
	defer ds.Close()
	names := []string{"class0", "class1", "class2"}
	assert.Equal(t, names, trainer.ClassNames(ds))
	assert.Nil(t, trainer.ClassNames(mem), "an in-memory dataset has no names")

	a := newModel(t, m, trainer.Options{Epochs: 1})
	assert.Nil(t, a.Classes())
	require.NoError(t, a.Train(context.Background(), ds))
	assert.Equal(t, names, a.Classes())
	top, err := a.Predict(mem.Images[1], 3)
	require.NoError(t, err)
	for _, p := range top[0] {
		assert.Equal(t, names[p.Class], p.Name)
	}
	var saved bytes.Buffer
	require.NoError(t, a.Save(&saved))
	b := newModel(t, m, trainer.Options{})
	require.NoError(t, b.Load(&saved))
	assert.Equal(t, names, b.Classes())
	again, err := b.Predict(mem.Images[1], 3)
	require.NoError(t, err)
	assert.Equal(t, top, again)

	digits := &data.MNIST{}
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}, trainer.ClassNames(digits))

	_, err = trainer.DecodeClassNames(map[string]string{trainer.MetaClasses: `["a","a"]`}, 3)
	assert.ErrorContains(t, err, `names class "a" twice`)
	_, err = trainer.DecodeClassNames(map[string]string{trainer.MetaClasses: `["a","b","c","d"]`}, 3)
	assert.ErrorContains(t, err, "names 4 classes; the model has 3")
	_, err = trainer.DecodeClassNames(map[string]string{trainer.MetaClasses: `nope`}, 3)
	assert.ErrorContains(t, err, "is not a JSON list of class names")
	assert.Equal(t, "7", trainer.ClassName(nil, 7))
}

// named is an in-memory dataset with class names, as an ImageFolder has.
type named struct {
	*trainertest.Memory
	names []string
}

func (n named) Classes() []string { return n.names }

// Test data whose classes are not the training data's is refused: labels
// are positions in the class list, so a test set without one class (an
// ImageFolder without one folder) would be scored against shifted names.
func TestLoopRefusesTestDataWithOtherClasses(t *testing.T) {
	m := trainertest.Tiny(t)
	mem := trainertest.Data(m.Spec, 12, 1)
	train := named{mem, []string{"cat", "dog", "emu"}}
	for _, c := range []struct {
		names []string
		want  string
	}{
		{[]string{"cat", "emu"}, `test data: its 2 classes are not the training data's 3 (it lacks "dog")`},
		{[]string{"cat", "dog", "eel"}, `(it lacks "emu"; it has "eel" besides)`},
		{[]string{"dog", "cat", "emu"}, "(they are in another order)"},
	} {
		loop := &trainer.Loop{Session: m.Session(t, 1), Train: train, Test: named{mem, c.names}, Epochs: 1}
		assert.ErrorContains(t, loop.Prepare(), c.want, "%v", c.names)
	}
	same := &trainer.Loop{Session: m.Session(t, 1), Train: train, Test: named{mem, []string{"cat", "dog", "emu"}}, Epochs: 1}
	assert.NoError(t, same.Prepare())
	unnamed := &trainer.Loop{Session: m.Session(t, 1), Train: train, Test: mem, Epochs: 1}
	assert.NoError(t, unnamed.Prepare(), "a dataset without names is not compared")
}
