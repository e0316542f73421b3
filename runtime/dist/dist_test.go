package dist

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/syncbuf"
)

// roleEnv makes the test binary act as a rank (or a launcher) instead of running tests.
const roleEnv = "CNNC_DIST_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(actAs(role))
	}
	os.Exit(m.Run())
}

// actAs is the test binary started by Launch (or by a test, as a launcher).
func actAs(role string) int {
	cfg, _, err := FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch role {
	case "env":
		fmt.Printf("rank=%d world=%d local=%d/%d node=%d addr=%s port=%d\n", cfg.Rank, cfg.WorldSize,
			cfg.LocalRank, cfg.LocalWorldSize, cfg.NodeRank, cfg.MasterAddr, cfg.MasterPort)
		fmt.Fprintf(os.Stderr, "no newline from rank %d", cfg.Rank)
		return 0
	case "fail2": // rank 2 fails, the others would run for a long time
		if cfg.Rank == 2 {
			fmt.Fprintln(os.Stderr, "rank 2 gives up")
			return 7
		}
		time.Sleep(60 * time.Second)
		return 0
	case "kill1": // rank 1 dies of SIGKILL
		if cfg.Rank == 1 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		time.Sleep(60 * time.Second)
		return 0
	case "waitint": // every rank waits for SIGINT, then ends as an interrupted trainer does
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT)
		fmt.Println("ready")
		select {
		case <-sig:
			fmt.Printf("rank %d interrupted\n", cfg.Rank)
			return 3
		case <-time.After(60 * time.Second):
			return 0
		}
	case "sleep": // every rank says its pid and sleeps
		fmt.Printf("pid %d\n", os.Getpid())
		time.Sleep(60 * time.Second)
		return 0
	case "launcher": // a launcher of 2 ranks of $CNNC_DIST_TEST_CHILD
		err := Launch(context.Background(), LaunchOptions{
			Procs: 2, Exe: os.Args[0], Args: []string{"-test.run=^$"},
			Env: append(os.Environ(), roleEnv+"="+os.Getenv("CNNC_DIST_TEST_CHILD")),
		})
		fmt.Fprintln(os.Stderr, "launcher:", err)
		var xe *ExitError
		if errors.As(err, &xe) {
			return xe.ExitCode()
		}
		if err != nil {
			return 1
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestFromEnv(t *testing.T) {
	_, ok, err := FromEnv(env(nil))
	require.NoError(t, err)
	assert.False(t, ok, "no RANK, no WORLD_SIZE: not part of a job")

	full := map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
		"GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
	cfg, ok, err := FromEnv(env(full))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, Config{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 29500}, cfg)
	assert.Equal(t, "10.0.0.1:29500", cfg.Addr())

	// the environment a launcher gives a rank reads back as the same Config, old values replaced
	back, ok, err := FromEnv(envOf(cfg.Environ([]string{"RANK=9", "PATH=/bin"})))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, cfg, back)

	one, ok, err := FromEnv(env(map[string]string{"RANK": "0", "WORLD_SIZE": "1"}))
	require.NoError(t, err, "one rank needs no address")
	assert.True(t, ok)
	assert.Equal(t, 1, one.WorldSize)

	bad := []struct {
		change map[string]string
		want   string
	}{
		{map[string]string{"RANK": "x"}, `RANK="x": not an integer`},
		{map[string]string{"RANK": "8"}, "RANK=8 is not in [0, WORLD_SIZE=8)"},
		{map[string]string{"RANK": ""}, "RANK is not set but WORLD_SIZE"},
		{map[string]string{"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0: there must be at least 1 rank"},
		{map[string]string{"MASTER_ADDR": ""}, "MASTER_ADDR or MASTER_PORT is not set"},
		{map[string]string{"MASTER_PORT": "70000"}, "MASTER_PORT=70000: not a TCP port"},
		{map[string]string{"LOCAL_RANK": ""}, "LOCAL_RANK is not set"},
		{map[string]string{"LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not in [0, LOCAL_WORLD_SIZE=4)"},
	}
	for _, b := range bad {
		kv := map[string]string{}
		for k, v := range full {
			kv[k] = v
		}
		for k, v := range b.change {
			kv[k] = v
		}
		_, _, err := FromEnv(env(kv))
		assert.ErrorContains(t, err, b.want, "%v", b.change)
	}
}

func envOf(list []string) func(string) string {
	m := map[string]string{}
	for _, kv := range list {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return env(m)
}

func TestFlags(t *testing.T) {
	o, err := Flags{GPUs: 4, NNodes: 1}.LaunchOptions()
	require.NoError(t, err)
	assert.Equal(t, 4, o.Procs)
	o, err = Flags{GPUs: 8, NNodes: 2, NodeRank: 1, MasterAddr: "node0", MasterPort: 29500}.LaunchOptions()
	require.NoError(t, err)
	assert.Equal(t, LaunchOptions{Procs: 8, Nodes: 2, NodeRank: 1, MasterAddr: "node0", MasterPort: 29500}, o)
	assert.True(t, Flags{GPUs: 2, NNodes: 1}.Launching())
	assert.False(t, Flags{GPUs: 1, NNodes: 1}.Launching())

	for f, want := range map[Flags]string{
		{GPUs: 0, NNodes: 1}:                           "--gpus 0: at least 1",
		{GPUs: 2, NNodes: 0}:                           "--nnodes 0: at least 1",
		{GPUs: 2, NNodes: 2, NodeRank: 2}:              "--node-rank 2 is not in [0, --nnodes 2)",
		{GPUs: 2, NNodes: 2, MasterAddr: "x"}:          "--nnodes 2 needs --master-addr and --master-port",
		{GPUs: 2, NNodes: 1, MasterPort: 65536}:        "--master-port 65536: not a TCP port",
		{GPUs: 2, NNodes: 2, MasterPort: 29500}:        "--nnodes 2 needs --master-addr",
		{GPUs: 2, NNodes: 1, NodeRank: -1}:             "--node-rank -1 is not in",
		{GPUs: -3, NNodes: 1, MasterAddr: "127.0.0.1"}: "--gpus -3",
	} {
		_, err := f.LaunchOptions()
		assert.ErrorContains(t, err, want, "%+v", f)
	}
}

// loopback is a Config for rank r of n on this machine, at a port that was free.
func loopback(t *testing.T, port, r, n int) Config {
	return Config{Rank: r, WorldSize: n, LocalRank: r, LocalWorldSize: n, MasterAddr: "127.0.0.1", MasterPort: port}
}

func freeTestPort(t *testing.T) int {
	p, err := freePort("127.0.0.1")
	require.NoError(t, err)
	return p
}

// meet runs Rendezvous for the given ranks of an n-rank job, each in a goroutine.
func meet(t *testing.T, port, n int, ranks []int, timeout time.Duration, cfgOf func(r int) Config) ([]*Session, []error) {
	t.Helper()
	sessions, errs := make([]*Session, n), make([]error, n)
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := loopback(t, port, r, n)
			if cfgOf != nil {
				cfg = cfgOf(r)
			}
			sessions[r], errs[r] = Rendezvous(context.Background(), cfg, func() ([]byte, error) {
				return []byte("the id, made by rank 0 only"), nil
			}, timeout)
		}()
	}
	wg.Wait()
	return sessions, errs
}

func TestRendezvousHandsOutTheID(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		port := freeTestPort(t)
		all := make([]int, n)
		for r := range all {
			all[r] = r
		}
		sessions, errs := meet(t, port, n, all, 20*time.Second, nil)
		for r := range n {
			require.NoError(t, errs[r], "rank %d of %d", r, n)
			assert.Equal(t, "the id, made by rank 0 only", string(sessions[r].ID), "rank %d of %d", r, n)
		}
		// the ranks end one after the other, each saying goodbye: no one takes it for a death
		for r := n - 1; r >= 0; r-- {
			require.NoError(t, sessions[r].Close())
			for k := range r {
				assert.NoError(t, sessions[k].Err(), "rank %d after rank %d left", k, r)
			}
		}
	}
}

func TestRendezvousWaitsAreBounded(t *testing.T) {
	t.Run("a rank never comes", func(t *testing.T) {
		port := freeTestPort(t)
		start := time.Now()
		_, errs := meet(t, port, 4, []int{0, 1, 3}, time.Second, nil)
		assert.Less(t, time.Since(start), 10*time.Second)
		assert.ErrorContains(t, errs[0], "rank 2 of 4 did not join within 1s")
		assert.ErrorContains(t, errs[0], "127.0.0.1:"+strconv.Itoa(port))
		for _, r := range []int{1, 3} {
			require.Error(t, errs[r])
			// told by rank 0 (or, late to start on a busy machine, found rank 0 gone)
			assert.Regexp(t, `rank 2 of 4 did not join within 1s|cannot reach rank 0`, errs[r].Error())
		}
	})
	t.Run("rank 0 never comes", func(t *testing.T) {
		port := freeTestPort(t)
		_, errs := meet(t, port, 2, []int{1}, 500*time.Millisecond, nil)
		assert.ErrorContains(t, errs[1], fmt.Sprintf("rank 1: cannot reach rank 0 at 127.0.0.1:%d within 500ms", port))
		assert.ErrorContains(t, errs[1], "MASTER_ADDR and MASTER_PORT")
	})
	t.Run("ctx ends the wait", func(t *testing.T) {
		port := freeTestPort(t)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := Rendezvous(ctx, loopback(t, port, 0, 2), func() ([]byte, error) { return []byte("x"), nil }, time.Minute)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

func TestRendezvousRejectsAMisconfiguredJob(t *testing.T) {
	t.Run("world sizes differ", func(t *testing.T) {
		port := freeTestPort(t)
		_, errs := meet(t, port, 3, []int{0, 1}, 5*time.Second, func(r int) Config {
			c := loopback(t, port, r, 2)
			if r == 1 {
				c = loopback(t, port, 1, 3)
			}
			return c
		})
		for _, err := range errs[:2] {
			assert.ErrorContains(t, err, "says WORLD_SIZE=3, rank 0 has 2")
		}
	})
	t.Run("two processes claim one rank", func(t *testing.T) {
		port := freeTestPort(t)
		_, errs := meet(t, port, 3, []int{0, 1, 2}, 5*time.Second, func(r int) Config {
			return loopback(t, port, min(r, 1), 3) // ranks 1 and 2 both say 1
		})
		assert.ErrorContains(t, errs[0], "both claim rank 1")
		assert.ErrorContains(t, errs[0], "pid")
	})
}

func TestSessionNamesTheRankThatDied(t *testing.T) {
	t.Run("a rank", func(t *testing.T) {
		port := freeTestPort(t)
		s, errs := meet(t, port, 3, []int{0, 1, 2}, 10*time.Second, nil)
		for _, err := range errs {
			require.NoError(t, err)
		}
		s[2].peers[0].Close() // rank 2's process ends without a goodbye
		for _, r := range []int{0, 1} {
			select {
			case <-s[r].Done():
				assert.ErrorContains(t, s[r].Err(), "rank 2 (")
				assert.ErrorContains(t, s[r].Err(), "is gone: its connection to rank 0 closed without a goodbye")
			case <-time.After(10 * time.Second):
				t.Fatalf("rank %d did not notice rank 2's end", r)
			}
		}
		for _, ss := range s {
			ss.Close()
		}
	})
	t.Run("rank 0", func(t *testing.T) {
		port := freeTestPort(t)
		s, errs := meet(t, port, 3, []int{0, 1, 2}, 10*time.Second, nil)
		for _, err := range errs {
			require.NoError(t, err)
		}
		s[0].mu.Lock()
		s[0].closing = true // rank 0's process ends: nothing of it runs any more
		s[0].mu.Unlock()
		for _, c := range s[0].peers[1:] {
			c.Close()
		}
		for _, r := range []int{1, 2} {
			select {
			case <-s[r].Done():
				assert.ErrorContains(t, s[r].Err(), fmt.Sprintf("rank 0 (at 127.0.0.1:%d) is gone", port))
			case <-time.After(10 * time.Second):
				t.Fatalf("rank %d did not notice rank 0's end", r)
			}
		}
		for _, ss := range s {
			ss.Close()
		}
	})
}

// A rank that stops with an error of its own says so (Fail) instead of goodbye: the others'
// sessions end naming it and why, as for a death — their collectives would wait for it.
func TestSessionNamesTheRankThatFailed(t *testing.T) {
	for _, failing := range []int{2, 0} {
		t.Run(fmt.Sprintf("rank %d", failing), func(t *testing.T) {
			port := freeTestPort(t)
			s, errs := meet(t, port, 3, []int{0, 1, 2}, 10*time.Second, nil)
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.NoError(t, s[failing].Fail(errors.New("reading batch 7: input/output error")))
			assert.NoError(t, s[failing].Err(), "its own failure is no news to it")
			want := "rank 2 ("
			if failing == 0 {
				want = fmt.Sprintf("rank 0 (at 127.0.0.1:%d)", port)
			}
			for r := range 3 {
				if r == failing {
					continue
				}
				select {
				case <-s[r].Done():
					assert.ErrorContains(t, s[r].Err(), want, "rank %d", r)
					assert.ErrorContains(t, s[r].Err(), "failed: reading batch 7: input/output error", "rank %d", r)
				case <-time.After(10 * time.Second):
					t.Fatalf("rank %d did not hear of rank %d's failure", r, failing)
				}
			}
			for _, ss := range s {
				ss.Close()
			}
			require.NoError(t, s[failing].Fail(errors.New("again")), "after Close: nothing")
		})
	}
}

// launchSelf launches n ranks of this test binary in role, with its output.
func launchSelf(t *testing.T, n int, role string, grace time.Duration) (error, string, time.Duration) {
	t.Helper()
	var out syncbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	err := Launch(ctx, LaunchOptions{Procs: n, Exe: os.Args[0], Args: []string{"-test.run=^$"},
		Env: append(os.Environ(), roleEnv+"="+role), Stdout: &out, Stderr: &out, StopGrace: grace})
	return err, out.String(), time.Since(start)
}

func TestLaunchSetsEachRanksEnvironment(t *testing.T) {
	err, out, _ := launchSelf(t, 3, "env", 0)
	require.NoError(t, err, out)
	port := regexpFind(t, out, `rank=0 world=3 local=0/3 node=0 addr=127\.0\.0\.1 port=(\d+)\n`)
	// rank 0 speaks as it is, the others after their rank; an unfinished last line is kept
	assert.Contains(t, out, "[rank 1] rank=1 world=3 local=1/3 node=0 addr=127.0.0.1 port="+port+"\n")
	assert.Contains(t, out, "[rank 2] rank=2 world=3 local=2/3 node=0 addr=127.0.0.1 port="+port+"\n")
	assert.Contains(t, out, "[rank 2] no newline from rank 2\n")
}

func regexpFind(t *testing.T, s, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	require.NotNil(t, m, "%q in:\n%s", re, s)
	return m[1]
}

func TestLaunchStopsTheOthersWhenARankFails(t *testing.T) {
	err, out, took := launchSelf(t, 4, "fail2", 2*time.Second)
	var xe *ExitError
	require.ErrorAs(t, err, &xe, out)
	assert.Equal(t, 2, xe.First.Rank)
	assert.Equal(t, 7, xe.First.Code)
	assert.Equal(t, 7, xe.ExitCode())
	assert.Contains(t, out, "[rank 2] rank 2 gives up")
	for _, r := range xe.Ranks {
		if r.Rank != 2 {
			assert.True(t, r.Stopped, "%v", r)
			assert.Equal(t, syscall.SIGTERM, r.Signal, "%v", r)
		}
	}
	assert.ErrorContains(t, err, "rank 2 (pid")
	assert.ErrorContains(t, err, "exited with status 7; then rank 0")
	assert.Less(t, took, 30*time.Second, "bounded by the settling moment and the grace period")
}

func TestLaunchNamesARankKilledBySignal(t *testing.T) {
	err, out, _ := launchSelf(t, 3, "kill1", 2*time.Second)
	var xe *ExitError
	require.ErrorAs(t, err, &xe, out)
	assert.Equal(t, 1, xe.First.Rank)
	assert.Equal(t, syscall.SIGKILL, xe.First.Signal)
	assert.Equal(t, 128+9, xe.ExitCode())
	assert.ErrorContains(t, err, "rank 1 (pid")
	assert.ErrorContains(t, err, "was killed by signal 9 (killed)")
}

// A rank killed by a signal within the settling moment is named before one that exited with
// an error (usually on finding it gone).
func TestResultPrefersTheRankThatDied(t *testing.T) {
	mk := func(r, code int, sig syscall.Signal, stopped bool) *rank {
		return &rank{cfg: Config{Rank: r, LocalRank: r}, exited: true,
			exit: RankExit{Rank: r, Pid: 100 + r, Code: code, Signal: sig, Stopped: stopped}}
	}
	ranks := []*rank{mk(0, 1, 0, false), mk(1, -1, syscall.SIGKILL, false), mk(2, -1, syscall.SIGTERM, true)}
	var xe *ExitError
	require.ErrorAs(t, result(ranks, ranks[0], nil, nil), &xe)
	assert.Equal(t, 1, xe.First.Rank)
	require.ErrorAs(t, result(ranks, ranks[0], syscall.SIGINT, nil), &xe)
	assert.Equal(t, 0, xe.First.Rank, "after an interrupt the first to end is named")
	assert.NoError(t, result([]*rank{mk(0, 0, 0, false)}, nil, nil, nil))
}

func TestLaunchForwardsInterrupts(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=launcher", "CNNC_DIST_TEST_CHILD=waitint")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen []string
	for ready := 0; ready < 2; {
		select {
		case l := <-lines:
			seen = append(seen, l)
			if strings.HasSuffix(l, "ready") {
				ready++
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("the ranks did not start: %q %s", seen, stderr.String())
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for l := range lines {
		seen = append(seen, l)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, stderr.String())
	assert.Equal(t, 3, ee.ExitCode(), "the ranks' own status: %s", stderr.String())
	assert.Contains(t, seen, "rank 0 interrupted")
	assert.Contains(t, seen, "[rank 1] rank 1 interrupted")
	assert.Contains(t, stderr.String(), "interrupted (interrupt forwarded to every rank)")
}

func TestRanksEndWithTheirLauncher(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=launcher", "CNNC_DIST_TEST_CHILD=sleep")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	var pids []int
	for len(pids) < 2 && sc.Scan() {
		if m := regexp.MustCompile(`pid (\d+)$`).FindStringSubmatch(sc.Text()); m != nil {
			p, _ := strconv.Atoi(m[1])
			pids = append(pids, p)
		}
	}
	require.Len(t, pids, 2)
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for _, p := range pids {
		for alive(p) {
			require.True(t, time.Now().Before(deadline), "rank pid %d outlived its launcher", p)
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// alive reports whether pid runs (a zombie, ended but not yet reaped, does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
