package codegen_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden .cu files under testdata/")

// The generated .cu of each example at batch 32, as a reader sees it
// (`cnnc build --emit-cuda`); `go test ./codegen -update` rewrites them.
func TestGoldenCUDA(t *testing.T) {
	for _, path := range examples {
		name := strings.TrimSuffix(filepath.Base(path), ".cnn")
		t.Run(name, func(t *testing.T) {
			_, prog := exampleProgram(t, path, 32)
			golden := filepath.Join("testdata", name+"_b32.cu")
			if *update {
				require.NoError(t, os.MkdirAll("testdata", 0o755))
				require.NoError(t, os.WriteFile(golden, prog.Source, 0o644))
				return
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test ./codegen -update to create it")
			if string(want) != string(prog.Source) {
				gotLines, wantLines := strings.Split(string(prog.Source), "\n"), strings.Split(string(want), "\n")
				for i := 0; i < max(len(gotLines), len(wantLines)); i++ {
					var g, w string
					if i < len(gotLines) {
						g = gotLines[i]
					}
					if i < len(wantLines) {
						w = wantLines[i]
					}
					if g != w {
						t.Fatalf("%s differs from the generated source at line %d (go test ./codegen -update rewrites it):\n got: %s\nwant: %s", golden, i+1, g, w)
					}
				}
			}
		})
	}
}
