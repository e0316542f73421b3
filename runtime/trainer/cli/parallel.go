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

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"

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
	r.closers = append(r.closers, s.Close)
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
	return r.sess.SetParallel(cfg.Rank, nccl.Reducer{Comm: comm, On: onDevice})
}
