package dist

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// LaunchOptions say how Launch starts this node's ranks.
type LaunchOptions struct {
	// Procs is the number of processes on this node: one per GPU.
	Procs int
	// Nodes is the number of nodes in the job (0 or 1: this one), NodeRank this node's rank
	// among them; ranks are numbered node by node (RANK = NodeRank*Procs + LOCAL_RANK).
	Nodes, NodeRank int
	// MasterAddr and MasterPort are where rank 0 listens. On one node they default to
	// 127.0.0.1 (the job stays off the network) and a free port; with more nodes both are
	// needed, the same on every node.
	MasterAddr string
	MasterPort int
	// Exe and Args are the program each rank runs: by default this process's executable and
	// arguments. A rank finds RANK set in its environment (FromEnv), which is how a trainer
	// knows to train instead of launching again.
	Exe  string
	Args []string
	// Env is the environment the ranks' variables are added to (default os.Environ()).
	Env []string
	// Stdout and Stderr (default os.Stdout, os.Stderr) get rank 0's output as it is and every
	// other rank's lines after "[rank N] ".
	Stdout, Stderr io.Writer
	// StopGrace is how long ranks have between SIGTERM and SIGKILL when Launch stops them
	// (default 10 s).
	StopGrace time.Duration
}

// settle is how long Launch waits after a rank fails before stopping the others: time for
// them to fail on their own, saying why, and for the one that died first to be told apart.
const settle = 500 * time.Millisecond

// RankExit is how one rank ended.
type RankExit struct {
	Rank, Pid int
	Code      int            // exit status; -1 when killed by a signal
	Signal    syscall.Signal // the signal that killed it, or 0
	Stopped   bool           // Launch stopped it after another rank failed (or ctx ended)
}

func (e RankExit) ok() bool { return e.Code == 0 && e.Signal == 0 }

func (e RankExit) String() string {
	what := fmt.Sprintf("exited with status %d", e.Code)
	if e.Signal != 0 {
		what = fmt.Sprintf("was killed by signal %d (%v)", int(e.Signal), e.Signal)
	}
	if e.Stopped {
		what += ", stopped by the launcher"
	}
	return fmt.Sprintf("rank %d (pid %d) %s", e.Rank, e.Pid, what)
}

// ExitError says that a job's ranks did not all succeed, naming the rank that failed first.
type ExitError struct {
	First RankExit // the rank that failed first (died, rather than being stopped)
	Ranks []RankExit
	// Interrupted is set when Launch forwarded SIGINT or SIGTERM to the ranks.
	Interrupted os.Signal
}

func (e *ExitError) Error() string {
	var others []string
	for _, r := range e.Ranks {
		if r.Rank != e.First.Rank && !r.ok() {
			others = append(others, r.String())
		}
	}
	msg := e.First.String()
	if e.Interrupted != nil {
		msg = fmt.Sprintf("interrupted (%v forwarded to every rank): %s", e.Interrupted, msg)
	}
	if len(others) > 0 {
		msg += "; then " + strings.Join(others, ", ")
	}
	return msg
}

// ExitCode is the status a launcher should exit with: the first failed rank's, or 128 plus
// the signal that killed it (as a shell says).
func (e *ExitError) ExitCode() int {
	if e.First.Signal != 0 {
		return 128 + int(e.First.Signal)
	}
	return e.First.Code
}

func (o *LaunchOptions) defaults() error {
	if o.Procs < 1 {
		return fmt.Errorf("launch: %d processes: at least 1", o.Procs)
	}
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.NodeRank < 0 || o.NodeRank >= o.Nodes {
		return fmt.Errorf("launch: node rank %d is not in [0, %d)", o.NodeRank, o.Nodes)
	}
	if o.Nodes > 1 && (o.MasterAddr == "" || o.MasterPort == 0) {
		return fmt.Errorf("launch: %d nodes need rank 0's address and port, the same on every node", o.Nodes)
	}
	if o.MasterAddr == "" {
		o.MasterAddr = "127.0.0.1"
	}
	if o.MasterPort == 0 {
		port, err := freePort(o.MasterAddr)
		if err != nil {
			return fmt.Errorf("launch: finding a free port for rank 0 on %s: %w", o.MasterAddr, err)
		}
		o.MasterPort = port
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("launch: finding this program: %w", err)
		}
		o.Exe, o.Args = exe, os.Args[1:]
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	return nil
}

// freePort asks the kernel for a port that is free now (rank 0 binds it a moment later; on
// one machine nothing else is expected to take it in between).
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// rank is one started process.
type rank struct {
	cfg    Config
	cmd    *exec.Cmd
	out    []*prefixWriter // flushed once the process has ended
	exited bool
	exit   RankExit
}

// Launch starts this node's Procs ranks of the program, one process each, with torchrun's
// variables set (Config.Environ), and waits for all of them. SIGINT and SIGTERM sent to the
// launcher are forwarded to every rank (each runs in its own process group, so a terminal's
// Ctrl-C reaches them once, through Launch). When a rank fails, the others get a moment to
// fail on their own, then SIGTERM, then SIGKILL after StopGrace: no rank is left waiting for
// one that died. The ranks also get SIGTERM if the launcher itself dies. The error is an
// *ExitError naming the rank that failed first.
func Launch(ctx context.Context, o LaunchOptions) error {
	if err := o.defaults(); err != nil {
		return err
	}
	// Pdeathsig is tied to the thread that starts the processes: keep it for the whole run.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var outMu sync.Mutex
	ranks := make([]*rank, o.Procs)
	exits := make(chan *rank, o.Procs)
	for i := range ranks {
		r := &rank{cfg: Config{
			Rank: o.NodeRank*o.Procs + i, WorldSize: o.Nodes * o.Procs,
			LocalRank: i, LocalWorldSize: o.Procs, NodeRank: o.NodeRank,
			MasterAddr: o.MasterAddr, MasterPort: o.MasterPort,
		}}
		r.cmd = exec.Command(o.Exe, o.Args...)
		r.cmd.Env = r.cfg.Environ(o.Env)
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		r.out = []*prefixWriter{{w: o.Stdout, mu: &outMu}, {w: o.Stderr, mu: &outMu}}
		if r.cfg.Rank != 0 {
			r.out[0].prefix = fmt.Sprintf("[rank %d] ", r.cfg.Rank)
			r.out[1].prefix = r.out[0].prefix
		}
		r.cmd.Stdout, r.cmd.Stderr = r.out[0].target(), r.out[1].target()
		if err := r.cmd.Start(); err != nil {
			signalAll(ranks[:i], syscall.SIGKILL)
			for range i {
				<-exits
			}
			return fmt.Errorf("launch: starting rank %d (%s): %w", r.cfg.Rank, o.Exe, err)
		}
		ranks[i] = r
		go func() {
			r.cmd.Wait()
			for _, w := range r.out {
				w.flush()
			}
			exits <- r
		}()
	}

	var (
		first       *rank
		interrupted os.Signal
		stopping    bool
		left        = len(ranks)
		settleC     <-chan time.Time
		killC       <-chan time.Time
		ctxDone     = ctx.Done()
	)
	stop := func() {
		if stopping {
			return
		}
		stopping = true
		for _, r := range ranks {
			if !r.exited {
				r.exit.Stopped = true
			}
		}
		signalAll(ranks, syscall.SIGTERM)
		killC = time.After(o.StopGrace)
	}
	for left > 0 {
		select {
		case r := <-exits:
			r.exited, left = true, left-1
			r.exit = exitOf(r)
			if !r.exit.ok() && first == nil && !r.exit.Stopped {
				first = r
				if interrupted == nil { // after an interrupt, ranks end as they choose (rank 0 may be checkpointing)
					settleC = time.After(settle)
				}
			}
		case <-settleC:
			stop()
		case <-killC:
			signalAll(ranks, syscall.SIGKILL)
		case sig := <-sigs:
			interrupted = sig
			signalAll(ranks, sig.(syscall.Signal))
		case <-ctxDone:
			ctxDone = nil
			stop()
		}
	}
	return result(ranks, first, interrupted, ctx.Err())
}

// exitOf reads a finished rank's end; a rank killed after Launch began stopping the ranks
// keeps its Stopped mark.
func exitOf(r *rank) RankExit {
	e := RankExit{Rank: r.cfg.Rank, Pid: r.cmd.Process.Pid, Code: r.cmd.ProcessState.ExitCode(), Stopped: r.exit.Stopped}
	if ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.Signal = ws.Signal()
	}
	if e.ok() {
		e.Stopped = false // it finished before the signal mattered
	}
	return e
}

// result names the rank that failed first: among the failures within the settling moment,
// one that died of a signal nobody sent it (a crash, the OOM killer, kill -9) before one
// that exited with an error (often the others, on seeing it gone), else the first reaped.
func result(ranks []*rank, first *rank, interrupted os.Signal, ctxErr error) error {
	all := make([]RankExit, len(ranks))
	var culprit *RankExit
	for i, r := range ranks {
		all[i] = r.exit
	}
	if first != nil {
		culprit = &all[first.cfg.LocalRank]
		for i := range all {
			if e := &all[i]; culprit.Signal == 0 && interrupted == nil && e.Signal != 0 && !e.Stopped {
				culprit = e
			}
		}
	}
	if culprit == nil {
		for i := range all {
			if !all[i].ok() {
				culprit = &all[i]
				break
			}
		}
	}
	if culprit == nil {
		return ctxErr
	}
	err := &ExitError{First: *culprit, Ranks: all, Interrupted: interrupted}
	if ctxErr != nil {
		return errors.Join(ctxErr, err)
	}
	return err
}

// signalAll sends sig to the process group of every rank still running.
func signalAll(ranks []*rank, sig syscall.Signal) {
	for _, r := range ranks {
		if r != nil && !r.exited && r.cmd.Process != nil {
			syscall.Kill(-r.cmd.Process.Pid, sig)
		}
	}
}

// prefixWriter writes whole lines to w, each after prefix; a line longer than maxLine is
// written in pieces (the output of a rank is never held without bound).
type prefixWriter struct {
	w       io.Writer
	prefix  string
	mu      *sync.Mutex // shared by every rank's writers: lines do not interleave
	pending []byte
}

const maxLine = 16 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.pending = append(p.pending, b...)
			if len(p.pending) >= maxLine {
				p.emit(append(p.pending, '\n'))
			}
			break
		}
		p.emit(append(p.pending, b[:i+1]...))
		b = b[i+1:]
	}
	return n, nil
}

func (p *prefixWriter) emit(line []byte) {
	p.mu.Lock()
	io.WriteString(p.w, p.prefix)
	p.w.Write(line)
	p.mu.Unlock()
	p.pending = p.pending[:0]
}

// target is what a process writes to: the file itself for rank 0's output to a file (a
// terminal stays a terminal for it), else the writer.
func (p *prefixWriter) target() io.Writer {
	if f, ok := p.w.(*os.File); ok && p.prefix == "" {
		return f
	}
	return p
}

// flush writes what is left of an unfinished last line.
func (p *prefixWriter) flush() {
	if len(p.pending) > 0 {
		p.emit(append(p.pending, '\n'))
	}
}

// Flags are a trainer's launch flags, torchrun's names.
type Flags struct {
	GPUs       int
	NNodes     int
	NodeRank   int
	MasterAddr string
	MasterPort int
}

// Register adds --gpus, --nnodes, --node-rank, --master-addr and --master-port to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.IntVar(&f.GPUs, "gpus", 1, "train on `N` GPUs of this machine, one process each (data parallel, over NCCL)")
	fs.IntVar(&f.NNodes, "nnodes", 1, "the number of machines in the job, each started with the same flags and its own --node-rank")
	fs.IntVar(&f.NodeRank, "node-rank", 0, "this machine's rank among --nnodes (0: the one at --master-addr)")
	fs.StringVar(&f.MasterAddr, "master-addr", "", "the address of machine 0, where rank 0 listens (default on one machine: 127.0.0.1)")
	fs.IntVar(&f.MasterPort, "master-port", 0, "the TCP port rank 0 listens on (default on one machine: a free one; torchrun's is 29500)")
}

// Launching reports whether the flags ask for more than one process.
func (f Flags) Launching() bool { return f.GPUs > 1 || f.NNodes > 1 }

// LaunchOptions checks the flags, naming the flag at fault, and turns them into options
// (Exe, Args and the rest are left to their defaults).
func (f Flags) LaunchOptions() (LaunchOptions, error) {
	switch {
	case f.GPUs < 1:
		return LaunchOptions{}, fmt.Errorf("--gpus %d: at least 1", f.GPUs)
	case f.NNodes < 1:
		return LaunchOptions{}, fmt.Errorf("--nnodes %d: at least 1", f.NNodes)
	case f.NodeRank < 0 || f.NodeRank >= f.NNodes:
		return LaunchOptions{}, fmt.Errorf("--node-rank %d is not in [0, --nnodes %d)", f.NodeRank, f.NNodes)
	case f.MasterPort < 0 || f.MasterPort > 65535:
		return LaunchOptions{}, fmt.Errorf("--master-port %d: not a TCP port (1 to 65535)", f.MasterPort)
	case f.NNodes > 1 && (f.MasterAddr == "" || f.MasterPort == 0):
		return LaunchOptions{}, fmt.Errorf("--nnodes %d needs --master-addr and --master-port: machine 0's address and a port, the same on every machine", f.NNodes)
	}
	return LaunchOptions{Procs: f.GPUs, Nodes: f.NNodes, NodeRank: f.NodeRank, MasterAddr: f.MasterAddr, MasterPort: f.MasterPort}, nil
}
