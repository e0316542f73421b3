package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/fakenccl"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/internal/syncbuf"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/dist"
)

// buildMNISTVariant builds examples/mnist.cnn with its train block's
// "batch = 64" replaced by batch, as name in dir (extra: cnnc build flags).
func buildMNISTVariant(t *testing.T, dir, name, batch string, extra ...string) string {
	t.Helper()
	src, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	text := strings.Replace(string(src), "batch = 64", batch, 1)
	require.NotEqual(t, string(src), text)
	model := filepath.Join(dir, name+".cnn")
	require.NoError(t, os.WriteFile(model, []byte(text), 0o644))
	bin := filepath.Join(dir, name)
	code, out, errOut := cnnc(append([]string{"build", model, "-o", bin}, extra...)...)
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	return bin
}

// A trainer built with --gpus 2 launches its 2 ranks (runtime/dist), which
// join over TCP, sum their gradients through NCCL — the fake libnccl of
// internal/fakenccl, on the CPU target's host memory — and train bit for
// bit as one process with accumulate = 2 (TestDataParallelRanksEqualAccumulate
// in codegen/trainergen says why): the checkpoints rank 0 writes hold the
// same parameters and optimizer state. A rank that is killed stops the
// job with an error naming it, and the checkpoint written before stays
// loadable.
func TestBuiltDataParallelTrainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two trainer binaries")
	}
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir := t.TempDir()
	lib := filepath.Join(dir, "nccl")
	require.NoError(t, fakenccl.Build(lib))
	dp := buildMNISTVariant(t, dir, "dp", "batch = 16", "--gpus", "2")
	acc := buildMNISTVariant(t, dir, "acc", "batch = 8\n    accumulate = 2")
	env := fakenccl.Environ(lib, os.Environ())
	run := func(bin string, args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String()
		}
		require.NoError(t, err)
		return 0, out.String()
	}

	// the rank count and the global batch are the built ones
	code, out := run(dp, "--data", mnist, "--gpus", "3")
	assert.Equal(t, 2, code)
	assert.Contains(t, out, "--gpus 3 × --nnodes 1: this trainer was compiled for 2 ranks")
	code, out = run(dp, "--data", mnist, "--batch", "8")
	assert.Equal(t, 2, code)
	assert.Contains(t, out, "--batch 8: this trainer's 2 ranks were compiled for the global batch 16")
	// the CUDA C of a rank: its loss is micro-batch rank of the global batch, rounded before
	// it is added, as the ranks' shares are summed (the CUDA rank's step: runtime/cuda's
	// TestDataParallelOnDevices)
	code, out, errOut := cnnc("build", "../../examples/mnist.cnn", "--emit-cuda", dir, "--gpus", "2")
	require.Equal(t, 0, code, out+errOut)
	cu, err := os.ReadFile(filepath.Join(dir, "mnist.cu"))
	require.NoError(t, err)
	assert.Contains(t, string(cu), "loss[0] += __fmul_rn(total, invBatch);")

	ckDP, ckAcc := filepath.Join(dir, "dp.safetensors"), filepath.Join(dir, "acc.safetensors")
	common := []string{"--data", mnist, "--test", "", "--max-steps", "5", "--quiet"}
	code, out = run(dp, append(common, "--checkpoint", ckDP)...)
	require.Equal(t, 0, code, out)
	code, out = run(acc, append(common, "--checkpoint", ckAcc)...)
	require.Equal(t, 0, code, out)
	assertSameCheckpoint(t, ckDP, ckAcc, "5")

	// the sharded optimizer: each rank keeps its parameters' momentum; the
	// checkpoint rank 0 writes after 3 steps holds all of it, and the run
	// resumed from it ends with the same bits as the one process's
	t.Run("sharded optimizer", func(t *testing.T) {
		code, out, errOut := cnnc("build", "../../examples/mnist.cnn", "-o", filepath.Join(dir, "bad"), "--shard-optimizer")
		assert.Equal(t, 2, code, out)
		assert.Contains(t, errOut, "--shard-optimizer shares the optimizer state among data-parallel ranks: it needs --gpus 2 or more")
		zero := buildMNISTVariant(t, dir, "zero", "batch = 16", "--gpus", "2", "--shard-optimizer")
		ck := filepath.Join(dir, "zero.safetensors")
		zeroArgs := []string{"--data", mnist, "--test", "", "--quiet", "--checkpoint", ck}
		code, out = run(zero, append(zeroArgs, "--max-steps", "3")...)
		require.Equal(t, 0, code, out)
		code, out = run(zero, append(zeroArgs, "--max-steps", "5", "--resume", ck)...)
		require.Equal(t, 0, code, out)
		assertSameCheckpoint(t, ck, ckAcc, "5")

		// SIGINT to one rank (the launcher forwards it to every rank, which
		// may get it at different steps; here only rank 1 gets it): every
		// rank stops after the same step (they agree every 16 steps),
		// rank 0 writes the checkpoint of that step with the whole state,
		// as accumulate = 2 has it then
		ckI, logI := filepath.Join(dir, "zero-int.safetensors"), filepath.Join(dir, "zero-int.jsonl")
		cmd := exec.Command(zero, "--data", mnist, "--test", "", "--quiet", "--checkpoint", ckI, "--log", logI)
		cmd.Env = env
		var outI bytes.Buffer
		cmd.Stdout, cmd.Stderr = &outI, &outI
		require.NoError(t, cmd.Start())
		rank1 := waitForRank(t, cmd.Process.Pid, "1", logI)
		require.NoError(t, syscall.Kill(rank1, syscall.SIGINT))
		err = cmd.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, outI.String())
		assert.Equal(t, 3, ee.ExitCode(), "interrupted, checkpoint written: %s", outI.String())
		assert.Contains(t, outI.String(), "checkpoint written to "+ckI)
		zi, err := checkpoint.Read(ckI)
		require.NoError(t, err)
		steps := zi.Metadata["step"]
		n, err := strconv.Atoi(steps)
		require.NoError(t, err)
		require.Positive(t, n)
		ckN := filepath.Join(dir, "acc-n.safetensors")
		code, out = run(acc, append(common[:len(common)-3], "--quiet", "--max-steps", steps, "--checkpoint", ckN)...)
		require.Equal(t, 0, code, out)
		assertSameCheckpoint(t, ckI, ckN, steps)
	})

	t.Run("a killed rank", func(t *testing.T) {
		cmd := exec.Command(dp, "--data", mnist, "--test", "", "--quiet", "--resume", ckDP, "--checkpoint", ckDP, "--log", filepath.Join(dir, "log.jsonl"))
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		rank1 := waitForRank(t, cmd.Process.Pid, "1", filepath.Join(dir, "log.jsonl"))
		require.NoError(t, syscall.Kill(rank1, syscall.SIGKILL))
		err := cmd.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, out.String())
		assert.NotZero(t, ee.ExitCode())
		assert.Contains(t, out.String(), "rank 1", "the error names the rank that died")
		log, err := os.ReadFile(filepath.Join(dir, "log.jsonl"))
		require.NoError(t, err)
		assert.Contains(t, strings.SplitN(string(log), "\n", 2)[0], `"size":16`, "rank 0 logs the global batch's steps")
		f, err := checkpoint.Read(ckDP)
		require.NoError(t, err, "the last checkpoint stays loadable")
		assert.NotEmpty(t, f.Metadata["step"])
		t.Log(out.String())
	})
}

// A trainer built with --gpus 1 --data-parallel is the data-parallel step
// of one rank — gradient buckets summed by NCCL, updates split off the
// weight-gradient kernels — the job gpu_check runs against the real NCCL on
// one GPU. It needs NCCL (a missing library is a clear error, so the path
// runs), and its checkpoint holds the bits of the plain trainer at the same
// batch: an all-reduce over one rank returns its input, a split update
// reads the fp32 gradient the fused one held in a register, and the loss
// (rounded once more as a rank's share: __fmul_rn(total, invBatch) into
// the sum of one) is only reported, never differentiated.
func TestBuiltOneRankDataParallelTrainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two trainer binaries")
	}
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir := t.TempDir()
	lib := filepath.Join(dir, "nccl")
	require.NoError(t, fakenccl.Build(lib))
	dp := buildMNISTVariant(t, dir, "dp1", "batch = 16", "--gpus", "1", "--data-parallel")
	plain := buildMNISTVariant(t, dir, "plain", "batch = 16")
	common := []string{"--data", mnist, "--test", "", "--max-steps", "4", "--quiet"}
	run := func(env []string, bin string, args ...string) (string, error) {
		cmd := exec.Command(bin, append(common, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// without NCCL the job stops, naming the library
	out, err := run(append(os.Environ(), "CNNC_NCCL_LIBRARY="+filepath.Join(dir, "absent", "libnccl.so.2")), dp)
	require.Error(t, err, out)
	assert.Contains(t, out, "libnccl.so.2", "the error names the library")

	// gpu_check times its step: --bench on the rank (its share, the global batch's count)
	bench := exec.Command(dp, "--bench", "2")
	bench.Env = fakenccl.Environ(lib, os.Environ())
	bout, err := bench.CombinedOutput()
	require.NoError(t, err, "%s", bout)
	assert.Regexp(t, `bench: MNISTNet on .*, batch 16: median step [\d.]+ ms over 2 steps`, string(bout))

	ckDP, ckPlain := filepath.Join(dir, "dp1.safetensors"), filepath.Join(dir, "plain.safetensors")
	out, err = run(fakenccl.Environ(lib, os.Environ()), dp, "--checkpoint", ckDP)
	require.NoError(t, err, out)
	out, err = run(os.Environ(), plain, "--checkpoint", ckPlain)
	require.NoError(t, err, out)
	assertSameCheckpoint(t, ckDP, ckPlain, "4")
}

// childrenOf are the pids of a process's children: those of every one of
// its threads (/proc/PID/task/TID/children lists a thread's own, and the
// Go runtime starts a child from whichever thread runs the goroutine).
func childrenOf(pid int) []string {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	var out []string
	for _, task := range tasks {
		if b, err := os.ReadFile(task); err == nil {
			out = append(out, strings.Fields(string(b))...)
		}
	}
	return out
}

// waitForRank is the pid of the child of launcher whose RANK is rank, once
// rank 0 has logged a step (the job is training); bounded by a minute.
func waitForRank(t *testing.T, launcher int, rank, log string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if b, err := os.ReadFile(log); err != nil || !bytes.Contains(b, []byte("\n")) {
			continue
		}
		for _, k := range childrenOf(launcher) {
			environ, err := os.ReadFile(filepath.Join("/proc", k, "environ"))
			if err == nil && bytes.Contains(append([]byte{0}, environ...), []byte("\x00RANK="+rank+"\x00")) {
				pid, err := strconv.Atoi(k)
				require.NoError(t, err)
				return pid
			}
		}
	}
	t.Fatalf("rank %s of launcher %d was not training within a minute", rank, launcher)
	return 0
}

// The same on the CUDA target: a trainer built with --gpus 2 --target
// cuda, run without GPUs under the fake driver with two devices (rank r
// opens GPU LOCAL_RANK) and the fake libnccl, joins NCCL on each device's
// thread and sums every gradient bucket on the all-reduce stream,
// overlapped with the backward pass (runtime/cuda's
// TestDataParallelOnDevices checks the order of its driver calls): rank
// 0's checkpoint holds the same bits as a CUDA trainer with accumulate =
// 2 — the same kernels, the same roundings (the argument above).
//
// With --shard-optimizer each rank keeps the momentum of its share only —
// fc1.weight's split in element ranges, which each rank's update kernel
// runs on — updates it on its device after the bucket's all-reduce and
// broadcasts it: every element takes the arithmetic of the unsharded
// update on the same summed gradient, so rank 0's checkpoint after 3
// steps (the whole state gathered from the ranks), and that of a run
// resumed from step 2 (each rank loading its share), hold the same bits
// as accumulate = 2's.
func TestBuiltCUDADataParallelTrainer(t *testing.T) {
	nvcc.Require(t)
	if testing.Short() {
		t.Skip("builds two CUDA trainer binaries")
	}
	mnist, dir, fake, lib := fakeCUDAWithNCCL(t)
	dp := buildMNISTVariant(t, dir, "dp", "batch = 16", "--gpus", "2", "--target", "cuda")
	acc := buildMNISTVariant(t, dir, "acc", "batch = 8\n    accumulate = 2", "--target", "cuda")
	zero := buildMNISTVariant(t, dir, "zero", "batch = 16", "--gpus", "2", "--shard-optimizer", "--target", "cuda")
	env := append(fakecuda.Environ(fake, fakenccl.Environ(lib, os.Environ())), fakecuda.DevicesEnv+"=2")
	run := func(bin, ck string, extra ...string) string {
		cmd := exec.Command(bin, append([]string{"--data", mnist, "--test", "", "--max-steps", "3", "--device", "cuda", "--checkpoint", ck}, extra...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	ckDP, ckAcc := filepath.Join(dir, "dp.safetensors"), filepath.Join(dir, "acc.safetensors")
	out := run(dp, ckDP)
	assert.Contains(t, out, "cnnc fake CUDA device (CPU emulator)", "rank 0 trains on the CUDA device")
	run(acc, ckAcc)
	assertSameCheckpoint(t, ckDP, ckAcc, "3")

	ckZero, ckResumed := filepath.Join(dir, "zero.safetensors"), filepath.Join(dir, "zero-resumed.safetensors")
	out = run(zero, ckZero)
	assert.Contains(t, out, "cnnc fake CUDA device (CPU emulator)", "the sharded rank 0 trains on the CUDA device")
	assertSameCheckpoint(t, ckZero, ckAcc, "3")
	ck2 := filepath.Join(dir, "zero-2.safetensors")
	run(zero, ck2, "--max-steps", "2")
	run(zero, ckResumed, "--resume", ck2)
	assertSameCheckpoint(t, ckResumed, ckAcc, "3")
}

// assertSameCheckpoint checks that the checkpoint at got was written after
// step and holds the same tensors as want's, bit for bit.
func assertSameCheckpoint(t *testing.T, got, want, step string) {
	t.Helper()
	g, err := checkpoint.Read(got)
	require.NoError(t, err)
	w, err := checkpoint.Read(want)
	require.NoError(t, err)
	assert.Equal(t, step, g.Metadata["step"], got)
	require.Equal(t, len(w.Tensors), len(g.Tensors), "%s against %s", got, want)
	for _, tw := range w.Tensors {
		tg, ok := g.Tensor(tw.Name)
		require.True(t, ok, tw.Name)
		assert.Equal(t, tw.Data, tg.Data, "%s after step %s: the same bits", tw.Name, step)
	}
}

// Ranks started one by one, as on several machines (each its own process
// with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, no launcher to kill
// the rest), under the fake libnccl hanging as real NCCL does when a rank
// dies (fakenccl.PeerDeathEnv: collectives wait forever, the asynchronous
// error stays ncclSuccess; its own timeout is 600 s): when one rank is
// killed mid-training, the others abort their communicators on the
// rendezvous's word and exit within seconds, naming the dead rank, and the
// checkpoint written before stays the one to resume from. rank 1 killed:
// rank 0 (the writer) and rank 2 (told by rank 0) survive; rank 0 killed:
// ranks 1 and 2, each seeing rank 0 gone.
func TestBuiltDataParallelRanksSurviveAKilledRank(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a trainer binary")
	}
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir := t.TempDir()
	lib := filepath.Join(dir, "nccl")
	require.NoError(t, fakenccl.Build(lib))
	dp := buildMNISTVariant(t, dir, "dp3", "batch = 24", "--gpus", "3")
	env := append(fakenccl.Environ(lib, os.Environ()), fakenccl.PeerDeathEnv+"=hang", fakenccl.TimeoutEnv+"=600")
	ck := filepath.Join(dir, "dp3.safetensors")
	common := []string{"--data", mnist, "--test", "", "--quiet", "--checkpoint", ck}
	ranks := startRanks(t, 3, dp, env, append(common, "--max-steps", "3")...)
	for r, rk := range ranks {
		require.NoError(t, rk.wait(time.Minute), "rank %d: %s", r, rk.out)
	}
	before, err := os.ReadFile(ck)
	require.NoError(t, err)

	for _, victim := range []int{1, 0} {
		t.Run(fmt.Sprintf("rank %d killed", victim), func(t *testing.T) {
			log := filepath.Join(dir, fmt.Sprintf("log%d.jsonl", victim))
			ranks := startRanks(t, 3, dp, env, append(common, "--resume", ck, "--log", log)...)
			waitForLog(t, log, ranks)
			require.NoError(t, ranks[victim].cmd.Process.Kill())
			killed := time.Now()
			// the victim's own goroutine waits for it (startRanksWith): a second
			// cmd.Wait beside that one can block forever in os/exec
			ranks[victim].wait(time.Minute)
			for r, rk := range ranks {
				if r == victim {
					continue
				}
				err := rk.wait(30 * time.Second)
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "rank %d: %s", r, rk.out)
				assert.NotZero(t, ee.ExitCode())
				out := rk.out.String()
				if victim == 0 {
					assert.Contains(t, out, fmt.Sprintf("rank %d stopped: rank 0 (at 127.0.0.1:", r), "rank %d names the rank that died", r)
				} else {
					assert.Contains(t, out, fmt.Sprintf("rank %d stopped: rank 1 (", r), "rank %d names the rank that died", r)
					assert.Contains(t, out, fmt.Sprintf("pid %d) is gone", ranks[1].cmd.Process.Pid))
				}
				// aborted inside its all-reduce, or (the watch was quicker) before the next
				assert.Regexp(t, abortedWords, out, "rank %d", r)
				t.Logf("rank %d: %s", r, out)
			}
			assert.Less(t, time.Since(killed), 30*time.Second, "the fake's timeout is 600 s: the ranks' own aborts freed them")
			after, err := os.ReadFile(ck)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the checkpoint written before the kill stays, untouched")
			f, err := checkpoint.Read(ck)
			require.NoError(t, err, "the last checkpoint stays loadable")
			assert.Equal(t, "3", f.Metadata["step"])
		})
	}

	// a rank that stops with an error of its own (here rank 1's data, after it
	// joined) tells the job so rather than goodbye: the others stop too
	t.Run("rank 1 fails", func(t *testing.T) {
		missing := filepath.Join(dir, "no-such-data")
		ranks := startRanksWith(t, 3, dp, env, func(r int) []string {
			if r == 1 {
				return []string{"--data", missing, "--test", "", "--quiet"}
			}
			return append(common, "--resume", ck)
		})
		for r, rk := range ranks {
			err := rk.wait(30 * time.Second)
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "rank %d: %s", r, rk.out)
			assert.NotZero(t, ee.ExitCode())
			if r != 1 {
				assert.Contains(t, rk.out.String(), fmt.Sprintf("rank %d stopped: rank 1 (", r), "rank %d", r)
				assert.Contains(t, rk.out.String(), "failed: ", "rank %d", r)
				assert.Contains(t, rk.out.String(), missing, "rank %d: rank 1's own error", r)
			}
			t.Logf("rank %d: %s", r, rk.out)
		}
		after, err := os.ReadFile(ck)
		require.NoError(t, err)
		assert.Equal(t, before, after)
	})
}

// The same on the CUDA target, under the fake driver with two devices: a
// rank's all-reduces are queued on its side stream from the device's
// thread, where the fake NCCL runs them at once — so the device's thread
// is the one blocked, and the abort comes from a thread of its own with
// the device's context (cuda.Device.OffThread); on a GPU the collective
// would spin in a kernel while the host blocks on its events until the
// watchdog's abort ends it (WatchWaits checks the job around the wait:
// runtime/cuda's TestWatchedWaits). Rank 1 is killed; rank 0 exits within
// seconds naming it, and its checkpoint stays the one written before.
func TestBuiltCUDADataParallelRanksSurviveAKilledRank(t *testing.T) {
	nvcc.Require(t)
	if testing.Short() {
		t.Skip("builds a CUDA trainer binary")
	}
	mnist, dir, fake, lib := fakeCUDAWithNCCL(t)
	dp := buildMNISTVariant(t, dir, "dp", "batch = 16", "--gpus", "2", "--target", "cuda")
	env := append(fakecuda.Environ(fake, fakenccl.Environ(lib, os.Environ())), fakecuda.DevicesEnv+"=2",
		fakenccl.PeerDeathEnv+"=hang", fakenccl.TimeoutEnv+"=600")
	ck, log := filepath.Join(dir, "dp.safetensors"), filepath.Join(dir, "log.jsonl")
	common := []string{"--data", mnist, "--test", "", "--quiet", "--device", "cuda", "--checkpoint", ck}
	ranks := startRanks(t, 2, dp, env, append(common, "--max-steps", "2")...)
	for r, rk := range ranks {
		require.NoError(t, rk.wait(5*time.Minute), "rank %d: %s", r, rk.out)
	}
	before, err := os.ReadFile(ck)
	require.NoError(t, err)

	ranks = startRanks(t, 2, dp, env, append(common, "--resume", ck, "--log", log)...)
	waitForLog(t, log, ranks)
	require.NoError(t, ranks[1].cmd.Process.Kill())
	killed := time.Now()
	err = ranks[0].wait(30 * time.Second)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, ranks[0].out.String())
	assert.NotZero(t, ee.ExitCode())
	out := ranks[0].out.String()
	t.Log(out)
	assert.Contains(t, out, "rank 0 stopped: rank 1 (", "rank 0 names the rank that died")
	assert.Contains(t, out, fmt.Sprintf("pid %d) is gone", ranks[1].cmd.Process.Pid))
	assert.Regexp(t, abortedWords, out)
	assert.Less(t, time.Since(killed), 30*time.Second, "the fake's timeout is 600 s: the rank's own abort freed it")
	after, err := os.ReadFile(ck)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the checkpoint written before the kill stays, untouched")
	f, err := checkpoint.Read(ck)
	require.NoError(t, err, "the last checkpoint stays loadable")
	assert.Equal(t, "2", f.Metadata["step"])
}

// abortedWords are a rank's words for its aborted communicator: a
// collective that the abort ended (the fake's), one called after it
// (runtime/nccl's), or — on the CUDA target, when a watched wait saw the
// job's failure before the collective returned (cuda.WatchWaits checks the
// job around each wait) — the trainer's own (runtime/trainer/cli's
// namingTheJob), whose step error is then the job's failure itself.
const abortedWords = `this rank aborted the communicator \(ncclCommAbort\)|the communicator was aborted|this rank's communicator was aborted`

// rankProcess is one rank of a job started by startRanks.
type rankProcess struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error
}

// wait is the rank's exit, failing the test when it runs longer than limit.
func (p *rankProcess) wait(limit time.Duration) error {
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(limit):
		return fmt.Errorf("still running after %v", limit)
	}
}

// startRanks starts the n ranks of the data-parallel trainer bin, each a
// process of its own with torchrun's variables (no launcher), on a free
// loopback port; they are killed at the test's end.
func startRanks(t *testing.T, n int, bin string, env []string, args ...string) []*rankProcess {
	t.Helper()
	return startRanksWith(t, n, bin, env, func(int) []string { return args })
}

// startRanksWith is startRanks with the arguments of each rank.
func startRanksWith(t *testing.T, n int, bin string, env []string, argsOf func(r int) []string) []*rankProcess {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	var ranks []*rankProcess
	for r := range n {
		cfg := dist.Config{Rank: r, WorldSize: n, LocalRank: r, LocalWorldSize: n, MasterAddr: "127.0.0.1", MasterPort: port}
		cmd := exec.Command(bin, argsOf(r)...)
		cmd.Env = cfg.Environ(env)
		p := &rankProcess{cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan error, 1)}
		cmd.Stdout, cmd.Stderr = p.out, p.out
		require.NoError(t, cmd.Start())
		go func() { p.done <- cmd.Wait() }()
		ranks = append(ranks, p)
	}
	t.Cleanup(func() {
		for _, p := range ranks {
			p.cmd.Process.Kill()
		}
	})
	return ranks
}

// waitForLog returns once rank 0 has logged a step (the job is training);
// bounded by a minute.
func waitForLog(t *testing.T, log string, ranks []*rankProcess) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(log); err == nil && bytes.Contains(b, []byte("\n")) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("rank 0 logged no step within a minute: %s", ranks[0].out)
}

// fakeCUDAWithNCCL builds the fake libcuda and libnccl in a temporary
// directory and points cnnc build at the fake driver (it registers the
// fatbin's kernels with it): the MNIST directory, the temporary directory,
// and the fakes' directories.
func fakeCUDAWithNCCL(t *testing.T) (mnist, dir, fake, lib string) {
	t.Helper()
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir = t.TempDir()
	fake, lib = filepath.Join(dir, "fakecuda"), filepath.Join(dir, "nccl")
	require.NoError(t, fakecuda.Build(fake))
	require.NoError(t, fakenccl.Build(lib))
	t.Setenv(fakecuda.Env, fake)
	return mnist, dir, fake, lib
}
