package data

// The Loader: per-epoch shuffled batches assembled by worker goroutines
// ahead of the consumer, in order, into a bounded set of recycled buffers.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
)

// LoaderOptions configure a Loader.
type LoaderOptions struct {
	// BatchSize is the number of samples per batch (> 0).
	BatchSize int
	// Seed determines every epoch's order, with the epoch number.
	Seed uint64
	// NoShuffle serves samples in index order every epoch.
	NoShuffle bool
	// DropLast drops the last batch when it is partial. The default keeps
	// it, as PyTorch's DataLoader does (drop_last=False).
	DropLast bool
	// Workers is the number of goroutines filling batches (default
	// GOMAXPROCS).
	Workers int
	// Prefetch is the number of batches that may be filled ahead of the
	// one the consumer holds (default 2*Workers). It bounds memory:
	// Prefetch+1 batch buffers exist.
	Prefetch int
	// Ranks > 1: data-parallel training over Ranks processes, this one
	// being Rank (0-based). BatchSize is then the global batch, a multiple
	// of Ranks, and every batch the loader yields is this rank's share of
	// the global batch one process would get with the same seed: samples
	// Rank·s .. (Rank+1)·s−1 of it, s = BatchSize/Ranks. The ranks' shares
	// are disjoint and together are that batch, in its order; in a partial
	// last batch the later ranks get fewer samples, or none
	// (Batch.GlobalSize says how many the whole batch has).
	Rank, Ranks int
}

// Batch is a group of samples. Pixels holds len(Labels) images of Shape,
// HWC, one after another; Indices are the samples' dataset indices.
type Batch struct {
	Epoch   int // the epoch it belongs to
	Number  int // its position in the epoch, from 0: save it to resume
	Shape   Shape
	Pixels  []uint8
	Labels  []int32
	Indices []int
	// GlobalSize is the samples of the whole global batch when the loader
	// shards batches over data-parallel ranks (LoaderOptions.Ranks > 1),
	// of which this batch is one rank's share; else Size().
	GlobalSize int
}

// Size is the number of samples in the batch.
func (b *Batch) Size() int { return len(b.Labels) }

// Loader hands out a Dataset in batches.
type Loader struct {
	ds   Dataset
	opts LoaderOptions
}

// NewLoader checks the options and returns a loader over ds.
func NewLoader(ds Dataset, opts LoaderOptions) (*Loader, error) {
	if opts.BatchSize <= 0 {
		return nil, fmt.Errorf("batch size %d: want at least 1", opts.BatchSize)
	}
	if err := opts.checkRanks(); err != nil {
		return nil, err
	}
	if ds.Len() == 0 {
		return nil, errors.New("the data set is empty")
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.Prefetch <= 0 {
		opts.Prefetch = 2 * opts.Workers
	}
	return &Loader{ds: ds, opts: opts}, nil
}

// checkRanks checks the data-parallel sharding options.
func (o LoaderOptions) checkRanks() error {
	switch {
	case o.Ranks < 0:
		return fmt.Errorf("%d ranks: want at least 1", o.Ranks)
	case o.Ranks <= 1 && o.Rank != 0:
		return fmt.Errorf("rank %d without data-parallel ranks", o.Rank)
	case o.Ranks <= 1:
		return nil
	case o.Rank < 0 || o.Rank >= o.Ranks:
		return fmt.Errorf("rank %d of %d: want 0..%d", o.Rank, o.Ranks, o.Ranks-1)
	case o.BatchSize%o.Ranks != 0:
		return fmt.Errorf("global batch %d does not split evenly over %d ranks", o.BatchSize, o.Ranks)
	}
	return nil
}

// share is the part [lo, hi) of a global batch [lo, hi) of the epoch's
// order that this rank takes.
func (o LoaderOptions) share(lo, hi int) (int, int) {
	if o.Ranks <= 1 {
		return lo, hi
	}
	s := o.BatchSize / o.Ranks
	return min(lo+o.Rank*s, hi), min(lo+(o.Rank+1)*s, hi)
}

// BatchesPerEpoch is the number of batches an epoch yields.
func (l *Loader) BatchesPerEpoch() int {
	n, b := l.ds.Len(), l.opts.BatchSize
	if l.opts.DropLast {
		return n / b
	}
	return (n + b - 1) / b
}

// Order returns the sample order of an epoch: a permutation of 0..Len()-1
// (the identity with NoShuffle). It is a pure function of the seed and the
// epoch, computed with our own Fisher-Yates shuffle over a PCG stream so
// that it stays the same across Go releases: a resumed run gets the order
// the interrupted one had.
func (l *Loader) Order(epoch int) []int {
	order := make([]int, l.ds.Len())
	for i := range order {
		order[i] = i
	}
	if l.opts.NoShuffle {
		return order
	}
	rng := rand.NewPCG(splitmix64(l.opts.Seed), splitmix64(l.opts.Seed^splitmix64(uint64(epoch))))
	for i := len(order) - 1; i > 0; i-- {
		j := boundedRandom(rng, uint64(i+1))
		order[i], order[j] = order[j], order[i]
	}
	return order
}

// splitmix64 scrambles a seed so that nearby seeds and epochs give
// unrelated streams.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// boundedRandom is a uniform integer in [0, n), by Lemire's
// multiply-and-reject method.
func boundedRandom(rng *rand.PCG, n uint64) int {
	hi, lo := bits.Mul64(rng.Uint64(), n)
	if lo < n {
		threshold := -n % n
		for lo < threshold {
			hi, lo = bits.Mul64(rng.Uint64(), n)
		}
	}
	return int(hi)
}

// batchJob is one batch being filled; done receives the outcome.
type batchJob struct {
	batch *Batch
	done  chan error
}

// Epoch yields an epoch's batches in order, starting at batch number first
// (0 for a whole epoch; a resumed run passes the number of batches of this
// epoch it has already trained on). A batch and its slices are valid until
// the loop body returns: their buffers are reused for later batches. The
// first error ends the sequence; breaking out of the loop stops the workers.
func (l *Loader) Epoch(ctx context.Context, epoch, first int) iter.Seq2[*Batch, error] {
	return func(yield func(*Batch, error) bool) {
		nb := l.BatchesPerEpoch()
		if first < 0 || first > nb {
			yield(nil, fmt.Errorf("epoch %d has %d batches; cannot start at batch %d", epoch, nb, first))
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		order := l.Order(epoch)
		shape := l.ds.Shape()
		bs := l.opts.BatchSize

		// free holds the buffers not in use; there are Prefetch+1 of them,
		// allocated on first use.
		free := make(chan *Batch, l.opts.Prefetch+1)
		for range l.opts.Prefetch + 1 {
			free <- nil
		}
		pending := make(chan batchJob, l.opts.Prefetch) // in batch order
		jobs := make(chan batchJob)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // dispatcher
			defer wg.Done()
			defer close(jobs)
			defer close(pending)
			for n := first; n < nb; n++ {
				var b *Batch
				select {
				case b = <-free:
				case <-ctx.Done():
					return
				}
				if b == nil {
					c := bs / max(l.opts.Ranks, 1) // a rank holds its share
					b = &Batch{
						Pixels:  make([]uint8, c*shape.Size()),
						Labels:  make([]int32, c),
						Indices: make([]int, c),
					}
				}
				glo, ghi := n*bs, min((n+1)*bs, len(order))
				lo, hi := l.opts.share(glo, ghi)
				b.Epoch, b.Number, b.Shape, b.GlobalSize = epoch, n, shape, ghi-glo
				b.Pixels = b.Pixels[:(hi-lo)*shape.Size()]
				b.Labels = b.Labels[:hi-lo]
				b.Indices = b.Indices[:hi-lo]
				copy(b.Indices, order[lo:hi])
				job := batchJob{batch: b, done: make(chan error, 1)}
				select {
				case pending <- job:
				case <-ctx.Done():
					return
				}
				select {
				case jobs <- job:
				case <-ctx.Done():
					job.done <- ctx.Err()
					return
				}
			}
		}()
		for range l.opts.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for job := range jobs {
					job.done <- l.fill(ctx, job.batch)
				}
			}()
		}
		defer func() { cancel(); wg.Wait() }() // stop and wait for the goroutines

		delivered := 0
		for job := range pending {
			if err := <-job.done; err != nil {
				yield(nil, err)
				return
			}
			if !yield(job.batch, nil) {
				return
			}
			delivered++
			b := job.batch
			b.Pixels, b.Labels, b.Indices = b.Pixels[:cap(b.Pixels)], b.Labels[:cap(b.Labels)], b.Indices[:cap(b.Indices)]
			free <- b
		}
		if delivered < nb-first { // the caller's context ended the epoch
			yield(nil, ctx.Err())
		}
	}
}

// fill reads the batch's samples.
func (l *Loader) fill(ctx context.Context, b *Batch) error {
	size := b.Shape.Size()
	for k, idx := range b.Indices {
		if k%16 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := l.ds.ReadImage(idx, b.Pixels[k*size:(k+1)*size]); err != nil {
			return err
		}
		b.Labels[k] = l.ds.Label(idx)
	}
	return nil
}
