package nccl

// The binding is tested against the fake libnccl (internal/fakenccl), built here with gcc:
// ranks are processes of this test binary, started by runtime/dist's launcher, that meet
// through its TCP rendezvous on the loopback interface; buffers are host memory (no CUDA
// driver in these processes). The same tests pass against NVIDIA's NCCL, on GPUs, with
// device buffers.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/fakenccl"
	"github.com/cnnc/cnnc/internal/syncbuf"
	"github.com/cnnc/cnnc/runtime/dist"
)

const (
	roleEnv   = "CNNC_NCCL_TEST_ROLE"
	outDirEnv = "CNNC_NCCL_TEST_OUT"
)

var fakeDir string // the fake libnccl.so.2's directory

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(actAs(role))
	}
	dir, err := os.MkdirTemp("", "fakenccl-")
	if err == nil {
		err = fakenccl.Build(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakeDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// ---- what a rank does --------------------------------------------------------------------

// actAs is this test binary as one rank of a job: it meets the others, joins the communicator
// and plays role. Failures are printed "rank R: ..." and end it with status 1.
func actAs(role string) int {
	cfg, _, err := dist.FromEnv(os.Getenv)
	if role == "load" {
		return load()
	}
	var comm *Comm
	var s *dist.Session
	if err == nil {
		comm, s, err = join(cfg)
	}
	if err == nil && role == "hang-watch" {
		err = hangWatch(comm, s)
	} else if err == nil {
		err = play(role, cfg, comm)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", cfg.Rank, err)
		return 1
	}
	return 0
}

func load() int {
	lib, err := Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(lib.Path(), lib.Version())
	return 0
}

// join meets the other ranks (rank 0's NCCL id handed out over TCP) and joins the communicator.
func join(cfg dist.Config) (*Comm, *dist.Session, error) {
	lib, err := Load()
	if err != nil {
		return nil, nil, err
	}
	s, err := dist.Rendezvous(context.Background(), cfg, func() ([]byte, error) {
		id, err := lib.UniqueID()
		return id[:], err
	}, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	var id UniqueID
	copy(id[:], s.ID)
	comm, err := lib.CommInitRank(id, cfg.WorldSize, cfg.Rank)
	return comm, s, err
}

// hangWatch is the "hang-watch" role, for the fake's hang mode: all-reduces until stopped (as
// "loop"), while a watchdog waits for the rendezvous to say a rank died; a second later it
// says whether the rank is still inside an all-reduce and what the asynchronous error is,
// then aborts the communicator, which must end that all-reduce.
func hangWatch(comm *Comm, s *dist.Session) error {
	var inCall sync.Mutex // held during each all-reduce
	go func() {
		<-s.Done()
		time.Sleep(time.Second)
		blocked := !inCall.TryLock()
		if !blocked {
			inCall.Unlock()
		}
		fmt.Fprintf(os.Stderr, "1 s after the session failed: blocked in an all-reduce %v, asynchronous error %v\n", blocked, comm.AsyncError())
		comm.Abort()
	}()
	start := time.Now()
	buf := hostBuffer(4096 * 4)
	for i := 0; time.Since(start) < time.Minute; i++ {
		inCall.Lock()
		err := comm.AllReduce(buf.addr, buf.addr, 4096, Float32, Sum, 0)
		inCall.Unlock()
		if err != nil {
			return fmt.Errorf("%w (the session: %v)", err, s.Err())
		}
		if i == 3 {
			fmt.Println("ready")
		}
	}
	return errors.New("not stopped within a minute")
}

func play(role string, cfg dist.Config, comm *Comm) error {
	switch role {
	case "sums":
		return sums(cfg, comm)
	case "loop": // all-reduce until stopped, saying "ready" after a few
		start := time.Now()
		buf := hostBuffer(4096 * 4)
		for i := 0; time.Since(start) < time.Minute; i++ {
			if err := comm.AllReduce(buf.addr, buf.addr, 4096, Float32, Sum, 0); err != nil {
				return err
			}
			if i == 3 {
				fmt.Println("ready")
			}
		}
		return errors.New("not stopped within a minute")
	case "silent": // rank 1 keeps rank 0 waiting
		if cfg.Rank == 1 {
			time.Sleep(5 * time.Second)
		}
		buf := hostBuffer(64)
		start := time.Now()
		err := comm.AllReduce(buf.addr, buf.addr, 16, Float32, Sum, 0)
		return fmt.Errorf("after %.1f s: %w", time.Since(start).Seconds(), err)
	case "mismatch": // rank 1 reduces one element more
		buf := hostBuffer(4 * 1001)
		return comm.AllReduce(buf.addr, buf.addr, 1000+cfg.Rank, Float32, Sum, 0)
	case "mismatch-root": // rank 1 broadcasts from another root
		buf := hostBuffer(4 * 1000)
		return comm.Broadcast(buf.addr, buf.addr, 1000, Float32, cfg.Rank, 0)
	case "broadcasts":
		return broadcasts(cfg, comm)
	}
	return fmt.Errorf("unknown role %q", role)
}

// ---- the data of the sums ------------------------------------------------------------------

// sumCases are the all-reduces "sums" runs: sizes across the fake's 1 MiB chunks, in place or
// not, float32 and bfloat16, alone or in a group.
var sumCases = []struct {
	name    string
	t       DataType
	count   int
	inPlace bool
	group   bool
}{
	{"f32", Float32, 300_001, false, false}, // two chunks, the last partial
	{"f32-inplace", Float32, 70_000, true, false},
	{"bf16", Bfloat16, 600_001, false, false},
	{"group-a", Float32, 1000, false, true},
	{"group-b", Bfloat16, 999, true, true},
}

// value is element i of rank r's buffer for case c: magnitudes from 2^-12 to 2^12 and both
// signs, so that sums round and their order matters.
func value(c, r, i int) float32 {
	h := splitmix(uint64(c)<<48 ^ uint64(r)<<40 ^ uint64(i))
	e := int(h%25) - 12
	m := 1 + float64(h>>8&0xffff)/65536
	if h>>32&1 == 1 {
		m = -m
	}
	return float32(math.Ldexp(m, e))
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// input is rank r's buffer for case k, as bytes.
func input(k, r int) []byte {
	c := sumCases[k]
	b := make([]byte, c.count*c.t.Size())
	for i := range c.count {
		v := value(k, r, i)
		if c.t == Bfloat16 {
			binary.LittleEndian.PutUint16(b[2*i:], fakenccl.Bfloat16(v))
		} else {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	return b
}

// sums is the "sums" role: every case of sumCases, the result written to $CNNC_NCCL_TEST_OUT.
// Each rank waits a different time before each collective, so that they arrive in different
// orders.
func sums(cfg dist.Config, comm *Comm) error {
	type job struct {
		k         int
		send, out buffer
	}
	var jobs []job
	for k, c := range sumCases {
		in := input(k, cfg.Rank)
		j := job{k: k, send: hostBuffer(len(in))}
		copy(j.send.b, in)
		j.out = j.send
		if !c.inPlace {
			j.out = hostBuffer(len(in))
		}
		jobs = append(jobs, j)
	}
	reduce := func(j job) error {
		c := sumCases[j.k]
		return comm.AllReduce(j.send.addr, j.out.addr, c.count, c.t, Sum, 0)
	}
	for i, j := range jobs {
		time.Sleep(time.Duration((cfg.Rank*7+i*3)%5) * 20 * time.Millisecond)
		if sumCases[j.k].group {
			continue
		}
		if err := reduce(j); err != nil {
			return fmt.Errorf("%s: %w", sumCases[j.k].name, err)
		}
	}
	err := comm.Library().Group(func() error {
		for _, j := range jobs {
			if sumCases[j.k].group {
				if err := reduce(j); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("group: %w", err)
	}
	for _, j := range jobs {
		name := filepath.Join(os.Getenv(outDirEnv), fmt.Sprintf("%s.rank%d", sumCases[j.k].name, cfg.Rank))
		if err := os.WriteFile(name, j.out.b, 0o644); err != nil {
			return err
		}
	}
	return comm.Destroy()
}

// broadcastCases are the broadcasts "broadcasts" runs, from every root in turn: across the
// fake's 1 MiB chunks, in place or not, float32 and bfloat16, alone or in a group (where every
// root broadcasts once).
var broadcastCases = []struct {
	name    string
	t       DataType
	count   int
	inPlace bool
	group   bool
}{
	{"f32", Float32, 300_001, false, false},
	{"f32-inplace", Float32, 70_000, true, false},
	{"bf16", Bfloat16, 600_001, true, false},
	{"group", Float32, 999, true, true},
}

// broadcastInput is rank r's buffer for broadcast case k from root: every rank's differs.
func broadcastInput(k, root, r int, t DataType, count int) []byte {
	b := make([]byte, count*t.Size())
	for i := range count {
		v := value(100+16*k+root, r, i)
		if t == Bfloat16 {
			binary.LittleEndian.PutUint16(b[2*i:], fakenccl.Bfloat16(v))
		} else {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	return b
}

// broadcasts is the "broadcasts" role: every case from every root, each result written to
// $CNNC_NCCL_TEST_OUT as <case>.root<R>.rank<r>.
func broadcasts(cfg dist.Config, comm *Comm) error {
	type job struct {
		k, root   int
		send, out buffer
	}
	var group []job
	write := func(j job) error {
		name := filepath.Join(os.Getenv(outDirEnv), fmt.Sprintf("%s.root%d.rank%d", broadcastCases[j.k].name, j.root, cfg.Rank))
		return os.WriteFile(name, j.out.b, 0o644)
	}
	for k, c := range broadcastCases {
		for root := range cfg.WorldSize {
			in := broadcastInput(k, root, cfg.Rank, c.t, c.count)
			j := job{k: k, root: root, send: hostBuffer(len(in))}
			copy(j.send.b, in)
			j.out = j.send
			if !c.inPlace {
				j.out = hostBuffer(len(in))
			}
			if c.group {
				group = append(group, j)
				continue
			}
			time.Sleep(time.Duration((cfg.Rank*7+root*3)%5) * 20 * time.Millisecond)
			if err := comm.Broadcast(j.send.addr, j.out.addr, c.count, c.t, root, 0); err != nil {
				return fmt.Errorf("%s from %d: %w", c.name, root, err)
			}
			if err := write(j); err != nil {
				return err
			}
		}
	}
	err := comm.Library().Group(func() error {
		for _, j := range group {
			c := broadcastCases[j.k]
			if err := comm.Broadcast(j.send.addr, j.out.addr, c.count, c.t, j.root, 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("group: %w", err)
	}
	for _, j := range group {
		if err := write(j); err != nil {
			return err
		}
	}
	if err := comm.Broadcast(0, 0, 1, Float32, cfg.WorldSize, 0); err == nil {
		return errors.New("a broadcast from a rank past the last was accepted")
	}
	return comm.Destroy()
}

// buffer is host memory outside Go's heap, handed to the library by address.
type buffer struct {
	b    []byte
	addr uintptr
}

func hostBuffer(n int) buffer {
	b, err := syscall.Mmap(-1, 0, max(n, 1), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return buffer{b: b[:n], addr: uintptr(unsafe.Pointer(&b[0]))}
}

// ---- tests -------------------------------------------------------------------------------

// launch runs n ranks of this test binary in role under the fake, and returns the launcher's
// error and everything the ranks printed.
func launch(t *testing.T, n int, role string, extraEnv ...string) (error, string) {
	t.Helper()
	var out syncbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := append(fakenccl.Environ(fakeDir, os.Environ()), roleEnv+"="+role, fakenccl.TimeoutEnv+"=60")
	err := dist.Launch(ctx, dist.LaunchOptions{Procs: n, Exe: os.Args[0], Args: []string{"-test.run=^$"},
		Env: append(env, extraEnv...), Stdout: &out, Stderr: &out, StopGrace: 5 * time.Second})
	return err, out.String()
}

// The sums of 2 and 4 ranks are the float32 (bfloat16) sums in rank order, bit for bit, on
// every rank — which rank arrives first does not matter.
func TestAllReduceSumsInRankOrder(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			dir := t.TempDir()
			err, out := launch(t, n, "sums", outDirEnv+"="+dir)
			require.NoError(t, err, out)
			for k, c := range sumCases {
				inputs := make([][]byte, n)
				for r := range n {
					inputs[r] = input(k, r)
				}
				want := sumInOrder(c.t, inputs, false)
				for r := range n {
					got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s.rank%d", c.name, r)))
					require.NoError(t, err)
					require.True(t, equalBytes(want, got), "%s: rank %d's sum is not the sum in rank order", c.name, r)
				}
				checkErrorBound(t, c.name, c.t, inputs, want)
				if n > 2 { // with 2 ranks x0 + x1 == x1 + x0: the order cannot show
					assert.False(t, equalBytes(want, sumInOrder(c.t, inputs, true)),
						"%s: the data should make the order of summation visible", c.name)
				}
			}
		})
	}
}

// Every rank receives the root's bits, from every root, in place or not, alone or in a group.
func TestBroadcastCopiesTheRootsBuffer(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			dir := t.TempDir()
			err, out := launch(t, n, "broadcasts", outDirEnv+"="+dir)
			require.NoError(t, err, out)
			for k, c := range broadcastCases {
				for root := range n {
					want := broadcastInput(k, root, root, c.t, c.count)
					for r := range n {
						got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s.root%d.rank%d", c.name, root, r)))
						require.NoError(t, err)
						require.True(t, equalBytes(want, got), "%s: rank %d did not get root %d's buffer", c.name, r, root)
						if r != root {
							require.False(t, equalBytes(want, broadcastInput(k, root, r, c.t, c.count)), "the ranks' inputs must differ")
						}
					}
				}
			}
		})
	}
}

// Ranks that broadcast from different roots fail, saying so.
func TestMismatchedBroadcastRootsFail(t *testing.T) {
	err, out := launch(t, 2, "mismatch-root")
	require.Error(t, err, out)
	assert.Contains(t, out, "rank 1 called collective #0 with 1000 x float32 (Broadcast from rank 1), rank 0 #0 with 1000 x float32 (Broadcast from rank 0)")
}

// sumInOrder is the sum the fake makes: in rank order (reverse: from the last rank), rounded
// after every addition as the type does.
func sumInOrder(t DataType, inputs [][]byte, reverse bool) []byte {
	if t == Bfloat16 {
		return fakenccl.SumBfloat16(inputs, reverse)
	}
	return fakenccl.SumFloat32(inputs, reverse)
}

// checkErrorBound compares the sums with the exact ones (float64 holds these sums of at most 4
// numbers exactly: their exponents span 2^-12..2^12 with 24-bit significands): n-1 additions,
// each rounded with unit roundoff u (2^-24 for float32, 2^-8 for bfloat16), are off by at most
// gamma_{n-1} * sum|x| with gamma_k = k*u/(1-k*u) (Higham, Accuracy and Stability of
// Numerical Algorithms, 4.2). An independent check that the fake adds the right numbers.
func checkErrorBound(t *testing.T, name string, dt DataType, inputs [][]byte, got []byte) {
	t.Helper()
	u := math.Ldexp(1, -24)
	if dt == Bfloat16 {
		u = math.Ldexp(1, -8)
	}
	k := float64(len(inputs) - 1)
	gamma := k * u / (1 - k*u)
	read := func(b []byte, i int) float64 {
		if dt == Bfloat16 {
			return float64(fakenccl.FromBfloat16(binary.LittleEndian.Uint16(b[2*i:])))
		}
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	for i := 0; i < len(got)/dt.Size(); i++ {
		exact, abs := 0.0, 0.0
		for _, in := range inputs {
			exact += read(in, i)
			abs += math.Abs(read(in, i))
		}
		if d := math.Abs(read(got, i) - exact); d > gamma*abs {
			t.Fatalf("%s: element %d is %g, the exact sum %g: off by %g > %g", name, i, read(got, i), exact, d, gamma*abs)
		}
	}
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// A rank that dies makes the others fail at once, naming it — they do not hang, and the
// launcher is not what stops them (they are started here directly).
func TestKilledRankStopsTheOthers(t *testing.T) {
	for _, victim := range []int{1, 0} {
		t.Run(fmt.Sprintf("rank %d killed", victim), func(t *testing.T) {
			const n = 3
			cmds, stderr := startRanks(t, n, "loop", fakenccl.TimeoutEnv+"=120")
			require.NoError(t, cmds[victim].Process.Kill())
			killed := time.Now()
			cmds[victim].Wait()
			for r := range n {
				if r == victim {
					continue
				}
				err := waitBounded(t, cmds[r], 30*time.Second, "rank %d still runs 30 s after rank %d was killed (timeout 120 s): %s", r, victim, stderr[r])
				t.Logf("%s", stderr[r])
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "rank %d: %s", r, stderr[r])
				assert.Equal(t, 1, ee.ExitCode(), "rank %d failed on its own: %s", r, stderr[r])
				assert.Contains(t, stderr[r].String(), fmt.Sprintf("rank %d (pid %d) closed its connection", victim, cmds[victim].Process.Pid))
				assert.Contains(t, stderr[r].String(), "ncclRemoteError")
			}
			assert.Less(t, time.Since(killed), 30*time.Second)
		})
	}
}

// With fakenccl.PeerDeathEnv=hang the fake hangs as real NCCL does: a rank that dies leaves
// the others blocked inside their all-reduce, the asynchronous error still ncclSuccess, until
// each aborts its communicator — here a watchdog of the rendezvous (role hang-watch), well
// before the fake's own timeout (600 s).
func TestHangModeBlocksUntilAbort(t *testing.T) {
	for _, victim := range []int{1, 0} {
		t.Run(fmt.Sprintf("rank %d killed", victim), func(t *testing.T) {
			const n = 3
			cmds, stderr := startRanks(t, n, "hang-watch", fakenccl.TimeoutEnv+"=600", fakenccl.PeerDeathEnv+"=hang")
			require.NoError(t, cmds[victim].Process.Kill())
			cmds[victim].Wait()
			for r := range n {
				if r == victim {
					continue
				}
				err := waitBounded(t, cmds[r], 30*time.Second, "rank %d still runs 30 s after rank %d was killed: %s", r, victim, stderr[r])
				t.Logf("%s", stderr[r])
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "rank %d: %s", r, stderr[r])
				out := stderr[r].String()
				assert.Contains(t, out, "1 s after the session failed: blocked in an all-reduce true, asynchronous error <nil>")
				assert.Contains(t, out, "this rank aborted the communicator (ncclCommAbort)")
				assert.Contains(t, out, fmt.Sprintf("rank %d (", victim), "the session names the rank that died")
				assert.Contains(t, out, "is gone")
				assert.NotContains(t, out, "closed its connection", "the fake said nothing of the death: it hung")
			}
		})
	}
	t.Run("in one process", func(t *testing.T) {
		t.Setenv(fakenccl.PeerDeathEnv, "hang")
		comms := inProcess(t, 2)
		require.NoError(t, comms[1].Abort()) // rank 1 leaves, telling no one
		buf := hostBuffer(64)
		done := make(chan error, 1)
		go func() { done <- comms[0].AllReduce(buf.addr, buf.addr, 16, Float32, Sum, 0) }()
		select {
		case err := <-done:
			t.Fatalf("the all-reduce returned without an abort: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
		assert.NoError(t, comms[0].AsyncError(), "hanging, as over NVLink: no asynchronous error")
		require.NoError(t, comms[0].Abort())
		select {
		case err := <-done:
			assert.ErrorContains(t, err, "AllReduce #0: this rank aborted the communicator (ncclCommAbort)")
		case <-time.After(10 * time.Second):
			t.Fatal("the all-reduce still blocks 10 s after Abort")
		}
	})
}

// startRanks starts n processes of this test binary as the ranks of a job playing role (env:
// more variables), directly rather than through the launcher, and returns once each has said
// it is ready; the ranks are killed at the test's end.
func startRanks(t *testing.T, n int, role string, env ...string) ([]*exec.Cmd, []*syncbuf.Buffer) {
	t.Helper()
	port, err := freePort()
	require.NoError(t, err)
	cmds := make([]*exec.Cmd, n)
	stderr := make([]*syncbuf.Buffer, n)
	ready := make(chan int, n)
	t.Cleanup(func() {
		for _, c := range cmds {
			if c != nil {
				c.Process.Kill()
			}
		}
	})
	for r := range n {
		cfg := dist.Config{Rank: r, WorldSize: n, LocalRank: r, LocalWorldSize: n, MasterAddr: "127.0.0.1", MasterPort: port}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(cfg.Environ(fakenccl.Environ(fakeDir, os.Environ())), append([]string{roleEnv + "=" + role}, env...)...)
		stderr[r] = &syncbuf.Buffer{}
		cmd.Stderr = stderr[r]
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
		go func() {
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			if line == "ready\n" {
				ready <- r
			}
			io.Copy(io.Discard, stdout)
		}()
	}
	for range n {
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatalf("the ranks did not get going: %q", stderr)
		}
	}
	return cmds, stderr
}

// waitBounded waits for cmd to exit, failing the test (msg) when it runs longer than limit.
func waitBounded(t *testing.T, cmd *exec.Cmd, limit time.Duration, msg string, args ...any) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf(msg, args...)
		return nil
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// A rank that stays silent fails the collective after the timeout, named.
func TestSilentRankTimesOut(t *testing.T) {
	err, out := launch(t, 2, "silent", fakenccl.TimeoutEnv+"=1")
	var xe *dist.ExitError
	require.ErrorAs(t, err, &xe, out)
	assert.Equal(t, 0, xe.First.Rank, out)
	// after the 1 s timeout (give or take a busy machine), before rank 1 wakes after 5 s
	assert.Regexp(t, `rank 0: after [1-4]\.\d s: nccl: ncclAllReduce: ncclTimeout \(timeout\): rank 0: AllReduce #0: rank 1 \(pid \d+\) sent nothing within the timeout`, out)
}

// Ranks that call different collectives fail, saying so, instead of summing garbage.
func TestMismatchedCollectivesFail(t *testing.T) {
	err, out := launch(t, 2, "mismatch")
	require.Error(t, err, out)
	const why = "rank 1 called collective #0 with 1001 x float32 (AllReduce, sum), rank 0 #0 with 1000 x float32 (AllReduce, sum): every rank must make the same collective calls in the same order"
	assert.Contains(t, out, "rank 0: nccl: ncclAllReduce: ncclInvalidUsage")
	assert.Contains(t, out, why)
	assert.Contains(t, out, "[rank 1] rank 1: nccl: ncclAllReduce: ncclRemoteError (remote process exited or there was a network error): rank 1: rank 0 stopped: AllReduce #0: "+why)
}

func openFake(t *testing.T) *Library {
	t.Helper()
	lib, err := Open(filepath.Join(fakeDir, fakenccl.LibName))
	require.NoError(t, err)
	return lib
}

func TestOneRank(t *testing.T) {
	lib := openFake(t)
	assert.Equal(t, Version{2, 21, 5}, lib.Version())
	id, err := lib.UniqueID()
	require.NoError(t, err)
	comm, err := lib.CommInitRank(id, 1, 0)
	require.NoError(t, err)
	assert.Equal(t, 0, comm.Rank())
	assert.Equal(t, 1, comm.Size())
	src, dst := hostBuffer(3*4), hostBuffer(3*4)
	copy(src.b, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	require.NoError(t, comm.AllReduce(src.addr, dst.addr, 3, Float32, Sum, 0))
	assert.Equal(t, src.b, dst.b, "the sum of one rank's buffer is the buffer")
	require.NoError(t, comm.AllReduce(src.addr, src.addr, 0, Float32, Sum, 0))
	require.NoError(t, comm.AsyncError())
	require.NoError(t, comm.Destroy())
	assert.ErrorContains(t, comm.AllReduce(src.addr, dst.addr, 3, Float32, Sum, 0), "nccl: AllReduce on rank 0: the communicator was destroyed")
	require.NoError(t, comm.Destroy(), "twice is harmless")
}

func TestErrorsInNCCLsWords(t *testing.T) {
	lib := openFake(t)
	id, err := lib.UniqueID()
	require.NoError(t, err)
	comm, err := lib.CommInitRank(id, 1, 0)
	require.NoError(t, err)
	defer comm.Destroy()
	buf := hostBuffer(8)

	err = comm.AllReduce(buf.addr, buf.addr, 4, Float16, Sum, 0)
	var ne *Error
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, "ncclAllReduce", ne.Call)
	assert.Equal(t, InvalidArgument, ne.Result)
	assert.Equal(t, "invalid argument (run with NCCL_DEBUG=WARN for details)", ne.Text)
	assert.Equal(t, "ncclAllReduce of float16 is not emulated by cnnc's fake libnccl", ne.Detail)
	assert.EqualError(t, err, "nccl: ncclAllReduce: ncclInvalidArgument (invalid argument (run with NCCL_DEBUG=WARN for details)): ncclAllReduce of float16 is not emulated by cnnc's fake libnccl")

	_, err = lib.CommInitRank(UniqueID{}, 1, 0)
	assert.ErrorContains(t, err, "rank 0 of 1: nccl: ncclCommInitRank: ncclInvalidArgument")
	_, err = lib.CommInitRank(id, 2, 2)
	assert.EqualError(t, err, "nccl: rank 2 of 2 ranks: the rank must be in [0, 2)")
	assert.ErrorContains(t, comm.AllReduce(buf.addr, buf.addr, -1, Float32, Sum, 0), "AllReduce of -1 elements")
	assert.ErrorContains(t, comm.AllReduce(buf.addr, buf.addr, 1, DataType(42), Sum, 0), "unknown data type 42")
	assert.Equal(t, "ncclRemoteError", RemoteError.String())
	assert.Equal(t, "ncclResult(99)", Result(99).String())
	assert.Equal(t, "bfloat16", Bfloat16.String())
	assert.Equal(t, 2, Bfloat16.Size())
}

func TestVersions(t *testing.T) {
	assert.Equal(t, Version{2, 21, 5}, versionFromCode(22105))
	assert.Equal(t, Version{2, 8, 4}, versionFromCode(2804), "NCCL_VERSION's old encoding, up to 2.8")
	assert.Equal(t, "2.9.6", versionFromCode(20906).String())
	assert.True(t, Version{2, 10, 0}.AtLeast(2, 10))
	assert.False(t, Version{2, 9, 9}.AtLeast(2, 10))
	assert.True(t, Version{3, 0, 0}.AtLeast(2, 10))

	t.Setenv(fakenccl.VersionEnv, "2804")
	lib := openFake(t)
	require.Equal(t, Version{2, 8, 4}, lib.Version())
	id, err := lib.UniqueID()
	require.NoError(t, err)
	comm, err := lib.CommInitRank(id, 1, 0)
	require.NoError(t, err)
	defer comm.Destroy()
	buf := hostBuffer(8)
	assert.ErrorContains(t, comm.AllReduce(buf.addr, buf.addr, 4, Bfloat16, Sum, 0), "AllReduce of bfloat16 needs NCCL 2.10 or newer; "+filepath.Join(fakeDir, "libnccl.so.2")+" is 2.8.4")
}

func TestMissingLibrary(t *testing.T) {
	_, err := Open("/nonexistent/libnccl.so.2")
	var me *MissingError
	require.ErrorAs(t, err, &me)
	for _, want := range []string{"nccl: cannot load /nonexistent/libnccl.so.2: ", "No such file", "more than one GPU",
		"apt-get install libnccl2", "pip install nvidia-nccl-cu12", "LD_LIBRARY_PATH", "CNNC_NCCL_LIBRARY"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = Open("libc.so.6")
	require.ErrorAs(t, err, &me)
	assert.ErrorContains(t, err, "cannot load libc.so.6: it has no ncclGetVersion: not NCCL, or older than 2.4")

	// Load: $CNNC_NCCL_LIBRARY, else libnccl.so.2 on the loader's path
	run := func(env ...string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append(env, roleEnv+"=load")...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(LibraryEnv + "=/nonexistent/dir/libnccl.so.2")
	assert.Error(t, err)
	assert.Contains(t, out, "nccl: cannot load /nonexistent/dir/libnccl.so.2")
	out, err = run(fakenccl.Environ(fakeDir, nil)...)
	require.NoError(t, err, out)
	assert.Equal(t, "libnccl.so.2 2.21.5\n", out)
}

// inProcess joins n ranks of one communicator in this process, one goroutine each (the fake
// allows it outside groups), for tests of one rank's calls.
func inProcess(t *testing.T, n int) []*Comm {
	t.Helper()
	lib := openFake(t)
	id, err := lib.UniqueID()
	require.NoError(t, err)
	comms, errs := make([]*Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = lib.CommInitRank(id, n, r)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return comms
}

// Abort, from another goroutine, ends a collective that waits for a rank that will not come;
// the other rank then learns that this one left.
func TestAbortEndsAWaitingCollective(t *testing.T) {
	comms := inProcess(t, 2)
	buf0, buf1 := hostBuffer(64), hostBuffer(64)
	done := make(chan error, 1)
	go func() { done <- comms[0].AllReduce(buf0.addr, buf0.addr, 16, Float32, Sum, 0) }()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, comms[0].Abort())
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "AllReduce #0: this rank aborted the communicator (ncclCommAbort)")
	case <-time.After(10 * time.Second):
		t.Fatal("the collective still waits 10 s after Abort")
	}
	err := comms[1].AllReduce(buf1.addr, buf1.addr, 16, Float32, Sum, 0)
	assert.ErrorContains(t, err, fmt.Sprintf("rank 1: AllReduce #0: rank 0 (pid %d) closed its connection", os.Getpid()))
	// Wait sees the asynchronous error at once, and aborts
	start := time.Now()
	err = comms[1].Wait(func() (bool, error) { return false, nil }, time.Minute)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.ErrorContains(t, err, "nccl: the communicator's asynchronous error: ncclRemoteError")
	assert.ErrorContains(t, comms[1].AllReduce(buf1.addr, buf1.addr, 16, Float32, Sum, 0), "the communicator was aborted")
}

// AbortOn's watchdog also reads the asynchronous error: a failure NCCL reports there (here a
// peer that closed its connection, as the fake reports it without hang mode) aborts the
// communicator within about asyncErrorEvery, and Failure says why — a wait that the abort
// ended reports that, not the driver's error.
func TestAbortOnWatchesTheAsynchronousError(t *testing.T) {
	comms := inProcess(t, 2)
	stop := comms[1].AbortOn(make(chan struct{}), nil)
	defer stop()
	require.NoError(t, comms[1].Failure())
	require.NoError(t, comms[0].Abort()) // rank 0 leaves
	buf := hostBuffer(64)
	assert.ErrorContains(t, comms[1].AllReduce(buf.addr, buf.addr, 16, Float32, Sum, 0), "closed its connection")
	deadline := time.Now().Add(10 * time.Second)
	for comms[1].Failure() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.ErrorContains(t, comms[1].Failure(), "ncclRemoteError", "the watchdog saw the asynchronous error")
	assert.ErrorContains(t, comms[1].AllReduce(buf.addr, buf.addr, 16, Float32, Sum, 0), "the communicator was aborted", "and aborted the communicator")
}

func TestWait(t *testing.T) {
	comms := inProcess(t, 1)
	calls := 0
	require.NoError(t, comms[0].Wait(func() (bool, error) { calls++; return calls == 3, nil }, time.Minute))
	assert.Equal(t, 3, calls)

	start := time.Now()
	err := comms[0].Wait(func() (bool, error) { return false, nil }, 100*time.Millisecond)
	assert.EqualError(t, err, "nccl: rank 0: collectives did not finish within 100ms (a rank died or stopped calling them?)")
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.ErrorContains(t, comms[0].AsyncError(), "the communicator was aborted", "Wait gave up on the communicator")

	comms = inProcess(t, 1)
	boom := errors.New("cuStreamQuery: an illegal memory access")
	assert.ErrorIs(t, comms[0].Wait(func() (bool, error) { return false, boom }, time.Minute), boom)
}

// Joining a communicator fails, naming the rank, when a rank does not come or disagrees.
func TestCommInitRankWaitsAreBounded(t *testing.T) {
	t.Setenv(fakenccl.TimeoutEnv, "1")
	lib := openFake(t)
	id, err := lib.UniqueID()
	require.NoError(t, err)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for _, r := range []int{0, 1} { // rank 2 never comes
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = lib.CommInitRank(id, 3, r)
		}()
	}
	wg.Wait()
	// (NCCL's last error is the process's: the ranks' threads share it here, so the words
	// may be either rank's; the results are each call's own)
	var e0, e1 *Error
	require.ErrorAs(t, errs[0], &e0)
	require.ErrorAs(t, errs[1], &e1)
	assert.Equal(t, Timeout, e0.Result)
	assert.Equal(t, RemoteError, e1.Result, "rank 1 hears rank 0's verdict")
	for _, err := range errs[:2] {
		assert.ErrorContains(t, err, "ncclCommInitRank: rank 2 of 3 did not join within 1 s")
	}

	id, err = lib.UniqueID()
	require.NoError(t, err)
	for r, n := range []int{2, 3} { // rank 1 thinks there are 3 ranks
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = lib.CommInitRank(id, n, r)
		}()
	}
	wg.Wait()
	want := fmt.Sprintf("rank 1 (pid %d) says there are 3 ranks, rank 0 says 2", os.Getpid())
	assert.ErrorContains(t, errs[0], want)
	assert.ErrorContains(t, errs[1], want)

	_, err = lib.CommInitRank(id, 2, 1) // no rank 0 listens for this id any more
	assert.ErrorContains(t, err, "ncclCommInitRank: rank 0 did not listen on @cnnc-fakenccl-")
}
