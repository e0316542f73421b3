// Package fakenccl builds a stand-in for NVIDIA's NCCL library, libnccl.so.2, that runs the
// collectives cnnc uses between processes on one machine, on the CPU.
//
// In: a directory to build the fake into. Out: dir/libnccl.so.2 (C, csrc/libnccl.c, compiled
// with gcc; no NCCL or CUDA headers needed).
//
// Why: data-parallel training is host code around NCCL — the binding (runtime/nccl), the
// unique id's exchange and the launcher (runtime/dist), the order of collectives — and NCCL
// needs GPUs. Run a process with LD_LIBRARY_PATH=dir (Environ) and runtime/nccl loads the fake
// instead: ranks are processes that meet over Unix sockets keyed by the unique id; an
// all-reduce sums on rank 0 in rank order ((x0 + x1) + x2 ...), so results are the same bits on
// every rank and in every run; a rank that dies makes the others fail at once with a message
// naming it, where real NCCL would hang — unless PeerDeathEnv=hang, which makes the fake hang
// as real NCCL does, for tests of what frees a job's survivors (their own watch of the
// rendezvous and ncclCommAbort). Under cnnc's fake CUDA driver (internal/fakecuda),
// buffers are its device pointers, read and written through the driver's copies; without a
// driver they are host memory. What it cannot show: NCCL's speed, its ring and tree orders of
// summation (so its sums may differ from real NCCL's in the last bits), real transports.
package fakenccl

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// LibName is the file the dynamic loader looks for (runtime/nccl opens it by this name).
const LibName = "libnccl.so.2"

// TimeoutEnv bounds, in seconds, how long a rank waits for another inside the fake (joining a
// communicator, or any exchange of a collective) before the collective fails; default 600, as
// PyTorch's NCCL timeout.
const TimeoutEnv = "CNNC_FAKENCCL_TIMEOUT"

// PeerDeathEnv set to "hang" makes the fake behave as real NCCL at worst when a rank dies:
// a collective that finds a rank gone blocks — and so do the ranks waiting on it — with
// ncclCommGetAsyncError still ncclSuccess (as over NVLink, where no network layer notices),
// until ncclCommAbort from another thread makes it fail ("this rank aborted the
// communicator"), or TimeoutEnv's seconds pass (ncclTimeout). An aborting rank then only
// closes its connections, telling the others nothing, so they hang in turn until they abort.
// Unset (or any other value), a rank's death makes the others fail at once, naming it.
const PeerDeathEnv = "CNNC_FAKENCCL_PEER_DEATH"

// VersionEnv makes the fake report another NCCL version code (ncclGetVersion), for tests of
// version checks.
const VersionEnv = "CNNC_FAKENCCL_VERSION"

//go:embed csrc/libnccl.c
var source []byte

// Build compiles the fake into dir/libnccl.so.2 with gcc.
func Build(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	file := filepath.Join(src, "libnccl.c")
	if err := os.WriteFile(file, source, 0o644); err != nil {
		return err
	}
	tmp := filepath.Join(dir, LibName+".tmp")
	args := []string{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
		"-Wl,-soname," + LibName, "-o", tmp, file, "-ldl", "-lpthread"}
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("fakenccl: building %s: %v\n%s", LibName, err, out)
	}
	return os.Rename(tmp, filepath.Join(dir, LibName))
}

// Environ returns base with dir first on LD_LIBRARY_PATH, so that a process started with it
// loads the fake as libnccl.so.2.
func Environ(dir string, base []string) []string {
	var env []string
	ld := dir
	for _, kv := range base {
		if old, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			if old != "" {
				ld += ":" + old
			}
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LD_LIBRARY_PATH="+ld)
}
