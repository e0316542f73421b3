package cli

// Data-parallel training from the command line. A trainer built for N
// ranks (cnnc build --gpus N: Spec.DataParallel) started by a user
// launches its ranks — this program again, one process per GPU, with
// torchrun's variables (runtime/dist.Launch) — and reports how they ended;
// started as a rank (RANK set), it joins the job (the TCP rendezvous
// hands NCCL's unique id from rank 0 to the others), trains on its share
// of every batch, and sums the gradients with the others through NCCL.
// Only rank 0 writes: checkpoints, --keep-best, --log, --plot, progress.
// Every rank evaluates (the same parameters give the same result), so
// that the best epoch and early stopping agree without a message.
//
// A rank that dies stops the others (watchJob): NCCL's collectives wait for
// every rank, and for a dead one forever (a GPU's kernels spin; the
// communicator's asynchronous error may never say so, as over NVLink), and
// on several machines no launcher is there to kill the rest. The
// rendezvous's connections say at once that a rank is gone; each rank
// then aborts its communicator, which ends the collective it waits in, and
// exits naming the rank that died. Nothing is saved after that: the last
// checkpoint (written atomically) stays the one to resume from.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/dist"
	"github.com/cnnc/cnnc/runtime/nccl"
)

// rendezvousTimeout bounds how long a rank waits for the others to join
// (torchrun's default rendezvous timeout is 900 s; ranks of one machine
// start within seconds).
const rendezvousTimeout = 5 * time.Minute

// registerDistFlags adds runtime/dist's launch flags (--gpus, --nnodes,
// --node-rank, --master-addr, --master-port) to fs.
func registerDistFlags(fs *pflag.FlagSet, o *options) {
	g := flag.NewFlagSet("dist", flag.ContinueOnError)
	o.dist.Register(g)
	fs.AddGoFlagSet(g)
}

// parallel handles the data-parallel side of the command line before
// anything else: it refuses --gpus on a one-device trainer, launches the
// ranks of a data-parallel trainer started by a user (done: the job's
// exit), and makes a rank's options those of a rank.
func (r *runner) parallel() (code int, err error, done bool) {
	o, dp := r.o, r.spec.DataParallel
	cfg, isRank, err := dist.FromEnv(os.Getenv)
	if err != nil {
		return ExitUsage, usageError{err}, true
	}
	if dp == nil {
		if o.dist.Launching() || (isRank && cfg.WorldSize > 1) {
			return ExitUsage, usagef("--gpus %d --nnodes %d: this trainer was compiled for one device; build one per rank's plan with `cnnc build --gpus N` (N: every GPU of the job)", o.dist.GPUs, o.dist.NNodes), true
		}
		return 0, nil, false
	}
	if !isRank {
		return r.launchRanks()
	}
	if cfg.WorldSize != dp.Ranks {
		return ExitUsage, usagef("WORLD_SIZE=%d: this trainer was compiled for %d ranks (cnnc build --gpus %d)", cfg.WorldSize, dp.Ranks, dp.Ranks), true
	}
	r.rank = &cfg
	if cfg.Rank != 0 { // rank 0 writes; the others train and keep quiet
		o.checkpoint, o.keepBest, o.log, o.plot = "", "", "", ""
		o.quiet = true
		r.out = io.Discard
	}
	return 0, nil, false
}

// launchRanks starts this machine's ranks and waits for them.
func (r *runner) launchRanks() (int, error, bool) {
	o, dp := r.o, r.spec.DataParallel
	if !o.changed("gpus") && o.dist.NNodes == 1 {
		o.dist.GPUs = dp.Ranks
	}
	if o.dist.GPUs*o.dist.NNodes != dp.Ranks {
		return ExitUsage, usagef("--gpus %d × --nnodes %d: this trainer was compiled for %d ranks (cnnc build --gpus %d); every rank's plan is specialised for its share of the batch", o.dist.GPUs, o.dist.NNodes, dp.Ranks, dp.Ranks), true
	}
	opts, err := o.dist.LaunchOptions()
	if err != nil {
		return ExitUsage, usageError{err}, true
	}
	opts.Stdout, opts.Stderr = o.stdout, o.stderr
	err = dist.Launch(context.Background(), opts)
	var exit *dist.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), err, true
	}
	if err != nil {
		return ExitError, err, true
	}
	return ExitOK, nil, true
}

// joinRanks joins this rank to the job's NCCL communicator and makes the
// session its rank.
func (r *runner) joinRanks() error {
	if r.rank == nil {
		return nil
	}
	cfg := *r.rank
	lib, err := nccl.Load()
	if err != nil {
		return fmt.Errorf("rank %d: %w", cfg.Rank, err)
	}
	s, err := dist.Rendezvous(context.Background(), cfg, func() ([]byte, error) {
		id, err := lib.UniqueID()
		return id[:], err
	}, rendezvousTimeout)
	if err != nil {
		return fmt.Errorf("rank %d: %w", cfg.Rank, err)
	}
	r.closers = append(r.closers, func() error { return r.leaveJob(s) })
	var id nccl.UniqueID
	copy(id[:], s.ID)
	var comm *nccl.Comm
	initRank := func(uintptr) error {
		comm, err = lib.CommInitRank(id, cfg.WorldSize, cfg.Rank)
		return err
	}
	var onDevice func(func(uintptr) error) error
	if on, ok := r.dev.(interface {
		OnStream(func(uintptr) error) error
	}); ok {
		// a GPU: NCCL takes the device from the context current on the
		// calling thread, the device's (runtime/cuda.Device.OnStream)
		onDevice = on.OnStream
		err = on.OnStream(initRank)
	} else {
		err = initRank(0)
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", cfg.Rank, err)
	}
	r.closers = append(r.closers, comm.Destroy)
	if err := r.watchJob(s, comm); err != nil {
		return fmt.Errorf("rank %d: %w", cfg.Rank, err)
	}
	return r.sess.SetParallel(cfg.Rank, nccl.Reducer{Comm: comm, On: onDevice})
}

// watchJob makes every wait of this rank that a dead rank could make
// endless end when the job fails (see the file's comment): a watchdog
// (nccl.Comm.AbortOn) aborts the communicator as soon as the session says
// a rank is gone, or the communicator's asynchronous error reports a
// failure — from a thread of its own with the device's context current on
// a GPU (runtime/cuda.Device.OffThread), as the device's thread may be the
// one waiting — which ends a collective called from the host (the CPU
// target; NCCL's enqueue, when it blocks) or the kernels of one queued on
// a GPU's stream, so the host's blocking wait for them returns; and on a
// device whose waits are watched (device.WaitWatcher: the CUDA rank, whose
// collectives run on a stream the host waits for through events and
// stream synchronisations) each wait checks the job before and after
// blocking, so that it returns the job's failure, and a step that an
// abort cut short is never taken for done. No wait polls: the host wakes
// as soon as the device's work is done, as on one device.
func (r *runner) watchJob(s *dist.Session, comm *nccl.Comm) error {
	r.job = s
	var on func(func() error) error
	if ot, ok := r.dev.(interface{ OffThread(func() error) error }); ok {
		on = ot.OffThread
	}
	stop := comm.AbortOn(s.Done(), on)
	ww, ok := r.dev.(device.WaitWatcher)
	r.closers = append(r.closers, func() error { // before Destroy
		stop()
		if ok && s.Err() == nil {
			return ww.WatchWaits(nil) // the device's last waits block, as on one device
		}
		return nil // (after a failure the check returns it at once, calling nothing)
	})
	if !ok {
		return nil
	}
	return ww.WatchWaits(func() error {
		if err := s.Err(); err != nil {
			return err // the watchdog aborts the communicator
		}
		return comm.Failure() // the watchdog aborted for it
	})
}

// leaveJob ends this rank's membership in the job: a goodbye when the rank
// is done, or stops with the others (an agreed interrupt, a loss that
// diverged on every rank alike, the job's failure); when it stops with an
// error of its own (r.failure) it tells the job so (Session.Fail), since
// the others would wait for it in their next collective forever — on
// several machines no launcher stops them.
func (r *runner) leaveJob(s *dist.Session) error {
	if r.failure != nil && s.Err() == nil {
		return s.Fail(r.failure)
	}
	return s.Close()
}

// jobFailed is why this rank's job failed — a rank died, or rank 0 said
// the job failed (runtime/dist.Session.Err) — or nil (one device too).
func (r *runner) jobFailed() error {
	if r.job == nil {
		return nil
	}
	return r.job.Err()
}

// namingTheJob makes err, this rank's error, start with the job's failure
// when the job failed: the rank stopped because another died, and the
// error it saw (an aborted collective) does not say which.
func (r *runner) namingTheJob(err error) error {
	jerr := r.jobFailed()
	if err == nil || jerr == nil {
		return err
	}
	return fmt.Errorf("rank %d stopped: %v (this rank's communicator was aborted; nothing was saved after it: %w)", r.rank.Rank, jerr, err)
}
