package kernelcheck

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/runtime/device"
)

// RangePoison is the NaN that fills every element an update over an
// element range must leave alone: a payload no arithmetic produces, so
// any write shows.
const RangePoison = 0x7fc0dead

// rangeGuard is how many poisoned words stand on each side of a range's
// state buffer in UpdateRange.
const rangeGuard = 64

// UpdateLaunch is update node n's one launch in prog and the index of its
// element range's first argument (codegen.UpdateRangeArgs), checked to
// cover the whole tensor as generated.
func UpdateLaunch(prog *codegen.Program, n *ir.Node) (*codegen.Launch, int, error) {
	var l *codegen.Launch
	for _, pl := range prog.Launches {
		if pl.Node == n {
			if l != nil {
				return nil, 0, fmt.Errorf("%s has more than one launch", n.Name)
			}
			l = pl
		}
	}
	if l == nil {
		return nil, 0, fmt.Errorf("no launch for %s", n.Name)
	}
	first, ok := codegen.UpdateRangeArgs(l)
	if !ok {
		return nil, 0, fmt.Errorf("%s's launch has no element range", n.Name)
	}
	if lo, hi := l.Args[first].Int, l.Args[first+1].Int; lo != 0 || hi != n.Ins[0].Type.SampleElems() {
		return nil, 0, fmt.Errorf("%s's launch covers [%d, %d), not the whole tensor", n.Name, lo, hi)
	}
	return l, first, nil
}

// UpdateRange runs update launch l (range arguments at first, first+1)
// on elements [lo, hi) of data (param, grad, the states — data[2:states]
// —, maybe a clipping coefficient) as a sharded rank does: param and grad
// whole, with every element outside the range poisoned (RangePoison);
// each state a buffer of the range's elements only, between poisoned
// guard words, which must keep their bits. It returns param and the
// states laid out as whole tensors, the elements outside the range as
// they came back: RangePoison unless something wrote there.
func UpdateRange(dev device.Device, l *codegen.Launch, first int, data [][]byte, states int, block device.Ptr, lo, hi int64) ([][]byte, error) {
	var bufs []device.Ptr
	defer func() {
		for _, p := range bufs {
			dev.Free(p)
		}
	}()
	alloc := func(b []byte) (device.Ptr, error) {
		p, err := dev.Alloc(int64(max(len(b), 4)))
		if err != nil {
			return 0, err
		}
		bufs = append(bufs, p)
		return p, dev.CopyIn(p, b)
	}
	guard := make([]byte, 4*rangeGuard)
	poisonOutside(guard, 0, 0)
	params := make([]uint64, len(l.Args))
	ptrs := make([]device.Ptr, len(data))
	for k, b := range data {
		switch {
		case k < 2:
			b = bytes.Clone(b)
			poisonOutside(b, lo, hi)
		case k < states: // the range's state between guards
			b = append(append(bytes.Clone(guard), b[4*lo:4*hi]...), guard...)
		}
		p, err := alloc(b)
		if err != nil {
			return nil, err
		}
		ptrs[k], params[k] = p, uint64(p)
		if k >= 2 && k < states {
			params[k] += 4 * rangeGuard
		}
	}
	params[first-1] = uint64(block)
	params[first], params[first+1] = uint64(lo), uint64(hi)
	if err := dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params); err != nil {
		return nil, err
	}
	if err := dev.Sync(); err != nil {
		return nil, err
	}
	out := [][]byte{make([]byte, len(data[0]))}
	if err := dev.CopyOut(out[0], ptrs[0]); err != nil {
		return nil, err
	}
	for k := 2; k < states; k++ {
		b := make([]byte, 4*(2*rangeGuard+hi-lo))
		if err := dev.CopyOut(b, ptrs[k]); err != nil {
			return nil, err
		}
		if !bytes.Equal(b[:4*rangeGuard], guard) || !bytes.Equal(b[4*(rangeGuard+hi-lo):], guard) {
			return nil, fmt.Errorf("state %d: a guard word around the range [%d, %d) was written", k, lo, hi)
		}
		whole := bytes.Clone(data[k])
		poisonOutside(whole, lo, hi) // the elements outside the range: never written
		copy(whole[4*lo:4*hi], b[4*rangeGuard:4*(rangeGuard+hi-lo)])
		out = append(out, whole)
	}
	return out, nil
}

// CheckUpdateRange compares got (UpdateRange over [lo, hi)) with whole
// (the update over the whole tensor): the range's elements bit for bit,
// every element outside it still RangePoison.
func CheckUpdateRange(whole, got [][]byte, lo, hi int64) error {
	for k := range got {
		if !bytes.Equal(whole[k][4*lo:4*hi], got[k][4*lo:4*hi]) {
			return fmt.Errorf("operand %d of the update over [%d, %d) differs from the whole update's", k, lo, hi)
		}
		for e := int64(0); e < int64(len(got[k])/4); e++ {
			if (e < lo || e >= hi) && binary.LittleEndian.Uint32(got[k][4*e:]) != RangePoison {
				return fmt.Errorf("operand %d's element %d, outside the update's range [%d, %d), was written", k, e, lo, hi)
			}
		}
	}
	return nil
}

// poisonOutside fills b's float32 elements outside [lo, hi) with RangePoison.
func poisonOutside(b []byte, lo, hi int64) {
	for e := int64(0); e < int64(len(b)/4); e++ {
		if e < lo || e >= hi {
			binary.LittleEndian.PutUint32(b[4*e:], RangePoison)
		}
	}
}
