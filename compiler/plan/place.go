package plan

import (
	"math/rand/v2"
	"sort"
)

// Placement: offsets for buffers with known sizes and live ranges, so that
// buffers live at the same time never overlap — dynamic storage
// allocation, NP-hard in general, small here (tens of buffers). The
// lower bound is the most bytes live at one step; alignment and gaps add
// the rest.
//
// Persistent buffers (parameters, then their optimizer state) go first,
// contiguous at the bottom, so a checkpoint is one copy; then, with data
// parallelism, the gradient buckets' buffers in bucket order (pin), so
// that each bucket is one range for one all-reduce. With a sharded
// optimizer the state goes after the parameters and model buffers, each
// rank's share from the same offset (a rank holds only its own: owner),
// so the region is the largest share. The others are
// placed one by one, each at the best-fitting (or lowest fitting) gap among
// the buffers already placed whose live ranges overlap it, in several
// orders: largest first (TFLite's greedy-by-size), largest size×lifetime
// first, earliest first. With effort > 0 a local search follows: move the
// buffer that sets the top earlier in the order, or swap two, and keep the
// order when the arena does not grow (deterministic, seeded).

// place sets every buffer's offset and returns the arena size.
func place(bufs []*buffer, align int64, effort int) int64 {
	var fixed, shards, pinned, rest []*buffer
	for _, b := range bufs {
		switch {
		case b.owner > 0:
			shards = append(shards, b)
		case b.insts[0].persistent:
			fixed = append(fixed, b)
		case b.pin > 0:
			pinned = append(pinned, b)
		default:
			rest = append(rest, b)
		}
	}
	sort.SliceStable(pinned, func(i, j int) bool { return pinned[i].pin < pinned[j].pin })
	var base int64
	for _, b := range fixed {
		b.offset = base
		base = alignUp(base+b.bytes, align)
	}
	shardBase, top := base, map[int]int64{}
	for _, b := range shards {
		at := shardBase + top[b.owner]
		b.offset = at
		top[b.owner] = alignUp(at+b.bytes, align) - shardBase
	}
	base += maxShare(top)
	for _, b := range pinned {
		b.offset = base
		base = alignUp(base+b.bytes, align)
	}
	// the local search stops at the most bytes live at once: no placement
	// does better
	steps := 0
	for _, b := range rest {
		steps = max(steps, b.last+1)
	}
	live := make([]int64, steps)
	for _, b := range rest {
		for s := b.first; s <= b.last; s++ {
			live[s] += alignUp(b.bytes, align) // every buffer but the top one is padded
		}
	}
	lower := base
	for _, l := range live {
		lower = max(lower, base+l)
	}
	orders := []func(x, y *buffer) bool{
		func(x, y *buffer) bool { return x.bytes > y.bytes },
		func(x, y *buffer) bool {
			return x.bytes*int64(x.last-x.first+1) > y.bytes*int64(y.last-y.first+1)
		},
		func(x, y *buffer) bool { return x.first < y.first },
	}
	best := int64(-1)
	var bestOrder []*buffer
	bestFirstFit := false
	try := func(order []*buffer, firstFit bool) int64 {
		var placed []*buffer
		top := base
		for _, b := range order {
			b.offset = fit(b, placed, base, align, firstFit)
			placed = append(placed, b)
			top = max(top, b.offset+b.bytes)
		}
		return top
	}
	for _, less := range orders {
		order := append([]*buffer(nil), rest...)
		sort.SliceStable(order, func(i, j int) bool { return less(order[i], order[j]) })
		for _, firstFit := range []bool{false, true} {
			if top := try(order, firstFit); best < 0 || top < best {
				best, bestOrder, bestFirstFit = top, order, firstFit
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < effort && best > lower && len(bestOrder) > 1; i++ {
		order := append([]*buffer(nil), bestOrder...)
		try(order, bestFirstFit)
		if i%2 == 0 {
			// move the buffer that reaches the top somewhere earlier
			hi := 0
			for j, b := range order {
				if b.offset+b.bytes > order[hi].offset+order[hi].bytes {
					hi = j
				}
			}
			if hi == 0 {
				continue
			}
			to := rng.IntN(hi)
			b := order[hi]
			copy(order[to+1:hi+1], order[to:hi])
			order[to] = b
		} else {
			x, y := rng.IntN(len(order)), rng.IntN(len(order))
			order[x], order[y] = order[y], order[x]
		}
		if top := try(order, bestFirstFit); top <= best {
			best, bestOrder = top, order
		}
	}
	try(bestOrder, bestFirstFit)
	arena := base
	for _, b := range bufs {
		arena = max(arena, b.offset+b.bytes)
	}
	return arena
}

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }

func overlaps(x, y *buffer) bool { return x.first <= y.last && y.first <= x.last }

// fit returns the offset of the smallest gap (or, firstFit, the lowest)
// at or above base that holds b among the placed buffers live at the same
// time, or the top.
func fit(b *buffer, placed []*buffer, base, align int64, firstFit bool) int64 {
	var busy []*buffer
	for _, p := range placed {
		if overlaps(b, p) {
			busy = append(busy, p)
		}
	}
	sort.Slice(busy, func(i, j int) bool { return busy[i].offset < busy[j].offset })
	at := alignUp(base, align)
	bestOff, bestWaste := int64(-1), int64(-1)
	for _, p := range busy {
		if gap := p.offset - at; gap >= b.bytes && (bestWaste < 0 || gap-b.bytes < bestWaste) {
			bestOff, bestWaste = at, gap-b.bytes
			if firstFit {
				return bestOff
			}
		}
		at = max(at, alignUp(p.offset+p.bytes, align))
	}
	if bestOff >= 0 {
		return bestOff
	}
	return at
}
