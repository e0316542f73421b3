package compiler

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cnnc/cnnc/dsl"
)

func addSeeds(f *testing.F) {
	for _, pattern := range []string{"../examples/*.cnn", "testdata/*.cnn"} {
		files, _ := filepath.Glob(pattern)
		for _, p := range files {
			src, err := os.ReadFile(p)
			if err == nil {
				f.Add(string(src))
			}
		}
	}
	for _, c := range errorCases {
		f.Add(c.src)
	}
	for _, m := range scaleModels { // deep nesting, many statements
		f.Add(m.gen(50))
	}
}

// FuzzCompile: on any input the front end finishes quickly, never panics,
// rejects with positioned diagnostics only, and what it accepts verifies.
func FuzzCompile(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, src string) {
		done := make(chan struct{})
		var res *Result
		var err error
		go func() {
			defer close(done)
			res, err = CompileSource("f.cnn", []byte(src), Options{})
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("compile hangs on %q", src)
		}
		if err != nil {
			var ds dsl.Diagnostics
			if !errors.As(err, &ds) {
				t.Fatalf("rejection is not a diagnostic: %T %v", err, err)
			}
			for _, d := range ds {
				if !d.Pos.IsValid() || d.Pos.File != "f.cnn" || d.Pos.Col < 1 {
					t.Fatalf("diagnostic without a position: %v", d)
				}
			}
			out := ds.RenderAll(map[string][]byte{"f.cnn": []byte(src)})
			if !strings.HasPrefix(out, "f.cnn:") {
				t.Fatalf("rendered diagnostic does not start with the position: %q", out)
			}
			for _, r := range out {
				if (r < 0x20 && r != '\n') || r == 0x7f || (r >= 0x80 && r < 0xa0) {
					t.Fatalf("rendered diagnostics carry a control character %U from the file: %q", r, out)
				}
			}
			return
		}
		if verr := res.Graph.Verify(); verr != nil {
			t.Fatalf("accepted model fails verification: %v\n%s", verr, res.Graph.Text())
		}
		if res.Summary == nil || res.Summary.Params != res.Graph.ParamCount() {
			t.Fatalf("summary missing or wrong")
		}
	})
}
