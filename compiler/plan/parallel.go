package plan

// Data parallelism: the plan of one rank of N, each training on its share
// of every batch (Config.Ranks > 1, or 1 with Config.DataParallel: the
// NCCL path of one GPU; Config.Batch is then the global batch,
// which must split evenly: rank r takes samples r·B/N .. (r+1)·B/N−1 of
// each batch, so N ranks see what one device sees).
//
// The ranks' gradients must be summed (NCCL's all-reduce) before any
// update, so no update can stay fused into its weight-gradient kernel:
// every layer's update is split off (as the planner already does for
// clip_grad_norm and micro-batch loops), its weight gradient written to a
// gradient buffer, and the separate updates run after the backward pass
// (as optimizer.step() after loss.backward() in PyTorch), each once its
// bucket's sum has arrived. Everything else — recomputation, micro-batch
// loops under a budget, accumulate — plans the rank's batch as one device
// would.
//
// Buckets. Summing gradient by gradient would launch one all-reduce per
// parameter; summing all at the end would leave the network idle during
// the backward pass. As PyTorch's DistributedDataParallel does, gradients
// are grouped into buckets in the order the backward pass writes them: a
// bucket's all-reduce starts as soon as its last gradient is written
// (Bucket.ReadyStep) and overlaps the rest of the backward pass. A bucket
// is one contiguous range of the arena, so that one all-reduce covers it:
// its buffers are placed together, after the parameters, optimizer state
// and model buffers, in a region of their own that lives for the whole
// step (PyTorch's gradient buckets persist too). The first bucket is small
// (FirstBucketBytes: its all-reduce starts early), the others close once
// they hold BucketBytes (PyTorch's defaults: 1 MiB and 25 MiB); one
// parameter's gradient is never split. The loss and the correct count
// (float32 scalars the loss kernel writes before any gradient) travel in
// the first bucket, so the host reads the global batch's.
//
// Sharding the optimizer state (Config.ShardOptimizer, ZeRO stage 1): each
// rank keeps the optimizer state of its share of the parameters, updates
// those parameters after the all-reduce and broadcasts them to the others.
// A parameter whose state is larger than an eighth of an even share (the
// state over the ranks, SplitFraction) is split in element ranges, as DeepSpeed's flat 1/N shares:
// rank r keeps the state of elements [r·k, (r+1)·k) of it, k = ⌈n/N⌉
// rounded up to RangeAlignElems, runs the update on that range only (both
// targets' update kernels take an element range) and broadcasts the
// range to the others (a broadcast per range is the all-gather; NCCL's own
// needs equal shares in one buffer). Its state buffers are one range each,
// at the same offset on every rank, persistent, placed with the parameters.
// The smaller parameters' state stays whole: a rank runs the update
// kernels of its parameters unchanged and skips the others', and the
// parameters' ranks broadcast them in place. They go to ranks largest
// state first, each to the rank holding the least so far (LPT scheduling:
// the largest share is at most the even share plus the last parameter
// placed: with the large ones split, at most 9/8 of an even share, padding
// aside), and a parameter
// without state stays updated by every rank. The whole parameters' state
// buffers are placed in one shard region (place) where every rank's share
// starts at the same offset: buffers of different ranks overlap, which is
// sound because no rank ever touches another's. So the arena really
// shrinks: the region is the largest share, and since placement is
// translation invariant (every other buffer is placed above the persistent
// region, at offsets relative to it, all multiples of the alignment) the
// rest of the arena moves down by exactly the state less the share
// (ShardCost).
//
// NCCL's own buffers are outside the arena (NCCL allocates them when the
// communicator is created); DataParallel.NCCLBytes is an estimate from
// NCCL's documented defaults, DataParallel.NCCLEstimate says how.

import (
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Bucket sizes: PyTorch DistributedDataParallel's defaults
// (bucket_cap_mb=25, and its first bucket of 1 MiB).
const (
	DefaultBucketBytes      = 25 << 20
	DefaultFirstBucketBytes = 1 << 20
)

// MaxRanks bounds Config.Ranks: more ranks than this is a typing error,
// not a cluster (NCCL itself is tested to a few tens of thousands).
const MaxRanks = 1 << 16

// NCCL's buffers, per rank: NCCL_BUFFSIZE (4 MiB, the documented default)
// for each protocol buffer of each connection of each channel. Assumed:
// 16 channels (NCCL's usual count between NVLink-connected GPUs; fewer
// over PCIe), 2 connections per channel (the ring's previous and next
// rank; a tree adds up to 3 more), 2 protocol buffers of NCCL_BUFFSIZE
// (Simple; LL and LL128 taken together as one more of the same size).
const (
	ncclBuffSize    = 4 << 20
	ncclChannels    = 16
	ncclConnections = 2
	ncclProtocols   = 2
)

// DataParallel describes the data-parallel side of a rank's plan.
type DataParallel struct {
	Ranks int `json:"ranks"`
	// GlobalBatch is the samples of one step over all ranks; each rank
	// takes Plan.Batch = GlobalBatch/Ranks of them.
	GlobalBatch int64    `json:"global_batch"`
	Buckets     []Bucket `json:"buckets"`
	// BucketBytes is the arena region the buckets take (gradients, loss
	// and correct count, alignment), from BucketOffset.
	BucketOffset int64 `json:"bucket_offset"`
	BucketBytes  int64 `json:"bucket_bytes"`
	// SplitUpdates counts the layers whose update is split out of their
	// weight-gradient kernel (one device may keep some fused).
	SplitUpdates int `json:"split_updates"`
	// NCCLBytes estimates the device memory NCCL allocates for itself per
	// rank, outside the arena (NCCLEstimate says how).
	NCCLBytes    int64  `json:"nccl_bytes"`
	NCCLEstimate string `json:"nccl_estimate"`
	// Shard is what sharding the optimizer state saves
	// (Config.ShardOptimizer); nil otherwise.
	Shard *ShardCost `json:"shard_optimizer,omitempty"`
	// OneDevicePeakBytes is the peak of the same model planned on one
	// device at the rank's batch (set by the caller that plans both, cnnc
	// plan; 0: not planned): the difference is what data parallelism adds.
	OneDevicePeakBytes int64 `json:"one_device_peak_bytes,omitempty"`
}

// Bucket is one all-reduce: a contiguous range of the arena.
type Bucket struct {
	Index int `json:"index"`
	// Offset and Bytes are the range the all-reduce sums (alignment gaps
	// between its buffers included: they are summed too and nobody reads
	// them); Elements = Bytes/4 float32 values.
	Offset   int64 `json:"offset"`
	Bytes    int64 `json:"bytes"`
	Elements int64 `json:"elements"`
	// Buffers are the plan's buffers in the bucket, in offset order, and
	// Values what they hold (gradients by parameter name, the loss, the
	// correct count).
	Buffers []int    `json:"buffers"`
	Values  []string `json:"values"`
	// ReadyStep is the step after which every value in the bucket is
	// written (a loop's last step when written in a loop): its all-reduce
	// starts then. NeededStep is the first later step that reads one of
	// them (an update, the clipping norm; -1: none, only the host): the
	// step waits for the all-reduce.
	ReadyStep  int `json:"ready_step"`
	NeededStep int `json:"needed_step"`
}

// ShardCost is what sharding the optimizer state saves (the plan's own
// peak is the sharded one).
type ShardCost struct {
	// StateBytes is the whole optimizer state (each buffer aligned), as
	// one device holds it; RankBytes each rank's share, ShardBytes the
	// largest: the shard region of the arena.
	StateBytes int64   `json:"state_bytes"`
	RankBytes  []int64 `json:"rank_bytes"`
	ShardBytes int64   `json:"shard_bytes"`
	// SplitParams are the parameters whose state is split in element
	// ranges over every rank (Buffer.RangeElems); the others' state lies
	// whole with one rank (Buffer.Owner).
	SplitParams []string `json:"split_params,omitempty"`
	// PeakBytes is the plan's peak, with the shard region; UnshardedBytes
	// the peak of the same plan holding the whole state: PeakBytes +
	// StateBytes − ShardBytes, exactly (placement is translation
	// invariant).
	PeakBytes      int64 `json:"peak_bytes"`
	UnshardedBytes int64 `json:"unsharded_bytes"`
}

// RangeElems of a split parameter's state are a multiple of
// RangeAlignElems (256 bytes of float32): a multiple of every vector width
// of the update kernels, so that each element takes the vector path it
// takes in the whole update (bit for bit the same arithmetic).
const RangeAlignElems = 64

// SplitFraction: a parameter's state is split in element ranges when it
// is larger than 1/SplitFraction of an even share (and has at least
// RangeAlignElems elements per rank); smaller ones stay whole, one
// broadcast each rather than one per rank.
const SplitFraction = 8

// dpConfig is the analysis's data-parallel setting (nil: one device).
type dpConfig struct {
	ranks                         int
	globalBatch                   int64
	bucketBytes, firstBucketBytes int64
	shard                         bool
}

// rankConfig checks cfg's ranks and returns the data-parallel setting and
// the rank's share of the batch.
func rankConfig(g *ir.Graph, cfg Config) (*dpConfig, int64, error) {
	if cfg.Ranks < 1 || (cfg.Ranks == 1 && !cfg.DataParallel) {
		if cfg.Ranks < 0 {
			return nil, 0, fmt.Errorf("plan: %d ranks: at least 1", cfg.Ranks)
		}
		if cfg.ShardOptimizer {
			return nil, 0, fmt.Errorf("plan: sharding the optimizer state needs data parallelism over more than one rank")
		}
		return nil, cfg.Batch, nil
	}
	switch {
	case cfg.Ranks > MaxRanks:
		return nil, 0, fmt.Errorf("plan: %d ranks: at most %d", cfg.Ranks, MaxRanks)
	case g.Infer:
		return nil, 0, fmt.Errorf("plan: data parallelism plans training; an inference plan runs on one device")
	case cfg.Batch%int64(cfg.Ranks) != 0:
		return nil, 0, fmt.Errorf("plan: the batch %d does not split evenly over %d ranks (each rank takes an equal share; try a batch of %d)",
			cfg.Batch, cfg.Ranks, (cfg.Batch/int64(cfg.Ranks)+1)*int64(cfg.Ranks))
	}
	dp := &dpConfig{ranks: cfg.Ranks, globalBatch: cfg.Batch, bucketBytes: cfg.BucketBytes, firstBucketBytes: cfg.FirstBucketBytes, shard: cfg.ShardOptimizer}
	if dp.bucketBytes <= 0 {
		dp.bucketBytes = DefaultBucketBytes
	}
	if dp.firstBucketBytes <= 0 {
		dp.firstBucketBytes = DefaultFirstBucketBytes
	}
	return dp, cfg.Batch / int64(cfg.Ranks), nil
}

// reduced says whether a buffer joins a bucket: a parameter's gradient,
// or a float32 scalar the host reads (the loss, the correct count).
func (b *buffer) reduced() bool {
	in := b.insts[0]
	if in.def < 0 || in.persistent {
		return false
	}
	if in.v.Role == ir.RoleGrad && in.v.Param != nil {
		return true
	}
	return in.keep && !in.v.Type.Batched && in.v.Type.DType == ir.F32
}

// pinBuckets groups the reduced buffers into buckets in the order they are
// written (backward order), numbers them for placement (buffer.pin, in
// bucket order) and makes them live for the whole step: the bucket region
// is reserved like the parameters.
func (c *candidate) pinBuckets(a *analysis) {
	var red []*buffer
	for _, b := range c.bufs {
		if b.reduced() {
			red = append(red, b)
		}
	}
	sort.SliceStable(red, func(i, j int) bool { return red[i].insts[0].def < red[j].insts[0].def })
	bucket, held := 0, int64(0)
	for i, b := range red {
		b.pin, b.bucket = i+1, bucket
		b.first, b.last = 0, len(c.steps)-1
		held += alignUp(b.bytes, a.align)
		limit := a.dp.bucketBytes
		if bucket == 0 {
			limit = a.dp.firstBucketBytes
		}
		if held >= limit {
			bucket, held = bucket+1, 0
		}
	}
}

// dataParallel is the plan's DataParallel, from the placed candidate.
func (a *analysis) dataParallel(c *candidate, p *Plan) *DataParallel {
	dp := &DataParallel{Ranks: a.dp.ranks, GlobalBatch: a.dp.globalBatch, SplitUpdates: len(c.split),
		NCCLBytes:    ncclChannels * ncclConnections * ncclProtocols * ncclBuffSize,
		NCCLEstimate: fmt.Sprintf("%d channels × %d connections (ring neighbours) × %d protocol buffers × NCCL_BUFFSIZE %s (NCCL's default); outside the arena, allocated by NCCL", ncclChannels, ncclConnections, ncclProtocols, mb(ncclBuffSize))}
	var pinned []*buffer
	for _, b := range c.bufs {
		if b.pin > 0 {
			pinned = append(pinned, b)
		}
	}
	sort.Slice(pinned, func(i, j int) bool { return pinned[i].pin < pinned[j].pin })
	for _, b := range pinned {
		if b.bucket == len(dp.Buckets) {
			dp.Buckets = append(dp.Buckets, Bucket{Index: b.bucket, Offset: b.offset, ReadyStep: -1, NeededStep: -1})
		}
		k := &dp.Buckets[b.bucket]
		k.Bytes = b.offset + b.bytes - k.Offset
		k.Elements = k.Bytes / 4
		k.Buffers = append(k.Buffers, b.id)
		in := b.insts[0]
		k.Values = append(k.Values, in.v.Name)
		k.ReadyStep = max(k.ReadyStep, c.readyAfter(in.def))
	}
	for i := range dp.Buckets {
		k := &dp.Buckets[i]
		k.NeededStep = firstReadAfter(p, k.Buffers, k.ReadyStep)
	}
	if n := len(dp.Buckets); n > 0 {
		dp.BucketOffset = dp.Buckets[0].Offset
		last := dp.Buckets[n-1]
		dp.BucketBytes = last.Offset + last.Bytes - dp.BucketOffset
	}
	if a.dp.shard {
		dp.Shard = shardCost(c, a.align, a.dp.ranks, p.PeakBytes)
	}
	return dp
}

// shardCost is what sharding c's optimizer state over ranks saves.
func shardCost(c *candidate, align int64, ranks int, peak int64) *ShardCost {
	s := &ShardCost{RankBytes: make([]int64, ranks), PeakBytes: peak}
	split := map[string]bool{}
	for _, b := range c.bufs {
		switch {
		case b.owner > 0:
			s.StateBytes += alignUp(b.bytes, align)
			s.RankBytes[b.owner-1] += alignUp(b.bytes, align)
		case b.rangeElems > 0:
			s.StateBytes += alignUp(b.wholeBytes, align)
			for r := range s.RankBytes {
				s.RankBytes[r] += alignUp(b.bytes, align)
			}
			if p := b.insts[0].v.Param; p != nil && !split[p.Name] {
				split[p.Name] = true
				s.SplitParams = append(s.SplitParams, p.Name)
			}
		}
	}
	s.ShardBytes = slices.Max(s.RankBytes)
	s.UnshardedBytes = peak + s.StateBytes - s.ShardBytes
	return s
}

// shardState splits the optimizer state of each parameter whose state
// outweighs an eighth of an even share in element ranges (buffer rangeElems) and gives
// each other parameter's to one rank (buffer owner): largest first, to the
// rank holding the least so far (the first of equals).
func (c *candidate) shardState(a *analysis) {
	byValue := map[*ir.Value]*buffer{}
	for _, b := range c.bufs {
		if b.insts[0].cat == CatState {
			byValue[b.insts[0].v] = b
		}
	}
	type param struct {
		bufs  []*buffer
		bytes int64
	}
	var ps []param
	for _, p := range c.g.Params {
		var q param
		for _, s := range p.State {
			if b := byValue[s]; b != nil {
				q.bufs = append(q.bufs, b)
				q.bytes += alignUp(b.bytes, a.align)
			}
		}
		if len(q.bufs) > 0 {
			ps = append(ps, q)
		}
	}
	var total int64
	for _, q := range ps {
		total += q.bytes
	}
	ranks := int64(a.dp.ranks)
	whole := ps[:0]
	for _, q := range ps {
		n := q.bufs[0].insts[0].v.Type.Elems(1)
		if q.bytes*ranks*SplitFraction <= total || n < RangeAlignElems*ranks {
			whole = append(whole, q)
			continue
		}
		k := alignUp((n+ranks-1)/ranks, RangeAlignElems)
		for _, b := range q.bufs {
			b.rangeElems, b.wholeBytes, b.bytes = k, b.bytes, 4*k
		}
	}
	ps = whole
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].bytes > ps[j].bytes })
	load := make([]int64, a.dp.ranks)
	for _, q := range ps {
		r := 0
		for i, l := range load {
			if l < load[r] {
				r = i
			}
		}
		load[r] += q.bytes
		for _, b := range q.bufs {
			b.owner = r + 1
		}
	}
}

// maxShare is the largest of the ranks' shares (0: none).
func maxShare(shares map[int]int64) int64 {
	var m int64
	for _, s := range shares {
		m = max(m, s)
	}
	return m
}

// readyAfter is the step after which step s's outputs are final: s, or the
// last step of the loop s is in (every iteration adds to an accumulator).
func (c *candidate) readyAfter(s int) int {
	if l := c.steps[s].loop; l >= 0 {
		return c.loops[l].last
	}
	return s
}

// firstReadAfter is the first step after step that reads one of bufs, or -1.
func firstReadAfter(p *Plan, bufs []int, step int) int {
	in := map[int]bool{}
	for _, b := range bufs {
		in[b] = true
	}
	for _, s := range p.Steps[step+1:] {
		for _, o := range s.Ins {
			if in[o.Buffer] {
				return s.Index
			}
		}
	}
	return -1
}

// reportDataParallel prints the rank's share, the buckets and what data
// parallelism adds to one device's plan.
func (p *Plan) reportDataParallel(w io.Writer) {
	dp := p.DataParallel
	if dp == nil {
		return
	}
	fmt.Fprintf(w, "\nData parallelism: %d ranks × batch %d = global batch %d (the peak above is one rank's)\n", dp.Ranks, p.Batch, dp.GlobalBatch)
	adds := fmt.Sprintf("%s bucket region (every gradient, the loss and the correct count, for the whole step); %d layers' updates split out of their weight-gradient kernels (run after the backward pass)", mb(dp.BucketBytes), dp.SplitUpdates)
	rows := [][]string{{"adds", adds}}
	if dp.OneDevicePeakBytes > 0 {
		d, sign := p.PeakBytes-dp.OneDevicePeakBytes, "+"
		if d < 0 {
			d, sign = -d, "-"
		}
		rows = append(rows, []string{"peak", fmt.Sprintf("%s vs %s on one device at batch %d (%s%s)", mb(p.PeakBytes), mb(dp.OneDevicePeakBytes), p.Batch, sign, commas(d))})
	}
	rows = append(rows,
		[]string{"NCCL", fmt.Sprintf("≈%s per rank outside the arena (an estimate: %s)", mb(dp.NCCLBytes), dp.NCCLEstimate)},
		[]string{"per rank", fmt.Sprintf("≈%s: the arena and NCCL's buffers", mb(p.PeakBytes+dp.NCCLBytes))})
	if s := dp.Shard; s != nil {
		rows = append(rows, []string{"--shard-optimizer", fmt.Sprintf("optimizer state at most %s per rank instead of %s (%s over %d ranks, ZeRO stage 1): peak %s instead of %s (-%s)",
			mb(s.ShardBytes), mb(s.StateBytes), splitSays(s.SplitParams), dp.Ranks, mb(s.PeakBytes), mb(s.UnshardedBytes), commas(s.UnshardedBytes-s.PeakBytes))})
	}
	table(w, rows, []bool{false, false}, "  ")
	bt := [][]string{{"bucket", "offset", "bytes", "all-reduce after step", "awaited at step", "values"}}
	for _, b := range dp.Buckets {
		needed := "-"
		if b.NeededStep >= 0 {
			needed = fmt.Sprint(b.NeededStep)
		}
		bt = append(bt, []string{fmt.Sprint(b.Index), commas(b.Offset), commas(b.Bytes), fmt.Sprint(b.ReadyStep), needed, joinShort(b.Values, 6)})
	}
	table(w, bt, []bool{true, true, true, true, true, false}, "  ")
}

// splitSays says how the state is shared out.
func splitSays(split []string) string {
	if len(split) == 0 {
		return "whole parameters' state"
	}
	if len(split) == 1 {
		return fmt.Sprintf("%s's state split in element ranges, the other parameters' whole", split[0])
	}
	return fmt.Sprintf("%d parameters' state split in element ranges (%s), the others' whole", len(split), joinShort(split, 3))
}

// joinShort joins up to n names, then says how many more.
func joinShort(xs []string, n int) string {
	s := ""
	for i, x := range xs {
		if i == n {
			return s + fmt.Sprintf(", … (%d more)", len(xs)-n)
		}
		if i > 0 {
			s += ", "
		}
		s += x
	}
	return s
}
