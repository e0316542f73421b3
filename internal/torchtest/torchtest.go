// Package torchtest runs the repository's PyTorch scripts (scripts/*.py)
// from Go tests: the numbers cnnc must match, computed by PyTorch itself.
//
// In:  a script's path and a JSON-encodable input.
// Out: the script's JSON output, decoded.
//
// Why: several tests compare cnnc with torch (optimizers, schedulers,
// losses); they share the one rule for a machine without PyTorch — skip
// loudly, or fail when CNNC_REQUIRE_TORCH=1 (CI) — and the way a script
// is run (Debian's python3, JSON on stdin and stdout, stderr in the error).
package torchtest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
)

// Python is Debian's python3, the one python3-torch installs into.
const Python = "/usr/bin/python3"

// Require skips t loudly when Python cannot import torch, or fails it
// when CNNC_REQUIRE_TORCH=1 (as in CI).
func Require(t testing.TB) {
	t.Helper()
	requireModule(t, "torch", "python3-torch")
}

// RequireVision is Require for tests that also need torchvision.
func RequireVision(t testing.TB) {
	t.Helper()
	Require(t)
	requireModule(t, "torchvision", "python3-torchvision")
}

// requireModule skips t loudly when Python cannot import module, or fails
// it when CNNC_REQUIRE_TORCH=1; pkg is the Debian package that has it.
func requireModule(t testing.TB, module, pkg string) {
	t.Helper()
	if err := exec.Command(Python, "-c", "import "+module).Run(); err != nil {
		if os.Getenv("CNNC_REQUIRE_TORCH") == "1" {
			t.Fatalf("CNNC_REQUIRE_TORCH=1 but %s cannot import %s: %v (apt-get install %s, or bash scripts/install-torch.sh)", Python, module, err, pkg)
		}
		t.Skipf("!!! SKIPPING %s: %s cannot import %s (bash scripts/install-torch.sh installs it)", t.Name(), Python, module)
	}
}

// Run runs script (a path) with in as JSON on its stdin and decodes its
// stdout into out. It calls Require first.
func Run(t testing.TB, script string, in, out any) {
	t.Helper()
	Require(t)
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatalf("torchtest: encoding the input of %s: %v", script, err)
	}
	cmd := exec.Command(Python, script)
	cmd.Stdin = bytes.NewReader(body)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("torchtest: %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("torchtest: %s printed what is not the expected JSON: %v\n%s", script, err, stdout.String())
	}
}
