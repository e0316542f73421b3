package fakenccl

import (
	"encoding/binary"
	"math"
)

// SumFloat32 is the fake's all-reduce of little-endian float32 buffers, in Go: elementwise,
// in rank order ((x0 + x1) + x2) ..., rounded after every addition — or from the last rank
// when reverse is set. Tests compare the fake's results with it bit for bit.
func SumFloat32(inputs [][]byte, reverse bool) []byte {
	return sumInOrder(inputs, reverse, 4, func(a, b []byte) {
		x, y := math.Float32frombits(binary.LittleEndian.Uint32(a)), math.Float32frombits(binary.LittleEndian.Uint32(b))
		binary.LittleEndian.PutUint32(a, math.Float32bits(float32(x+y)))
	})
}

// SumBfloat16 is SumFloat32 for bfloat16 buffers: each addition in float32 (exact for two
// bfloat16 values, up to a rounding that cannot create a bfloat16 tie), rounded to bfloat16.
func SumBfloat16(inputs [][]byte, reverse bool) []byte {
	return sumInOrder(inputs, reverse, 2, func(a, b []byte) {
		x, y := FromBfloat16(binary.LittleEndian.Uint16(a)), FromBfloat16(binary.LittleEndian.Uint16(b))
		binary.LittleEndian.PutUint16(a, Bfloat16(float32(x+y)))
	})
}

func sumInOrder(inputs [][]byte, reverse bool, size int, add func(acc, x []byte)) []byte {
	order := make([]int, len(inputs))
	for i := range order {
		order[i] = i
		if reverse {
			order[i] = len(inputs) - 1 - i
		}
	}
	out := append([]byte(nil), inputs[order[0]]...)
	for _, r := range order[1:] {
		for i := 0; i+size <= len(out); i += size {
			add(out[i:i+size], inputs[r][i:i+size])
		}
	}
	return out
}

// Bfloat16 rounds f to bfloat16, to nearest with ties to even (as __float2bfloat16_rn); a NaN
// stays a NaN.
func Bfloat16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16 | 0x40)
	}
	u += 0x7fff + (u >> 16 & 1)
	return uint16(u >> 16)
}

// FromBfloat16 is the float32 of a bfloat16 (exact).
func FromBfloat16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
