package codegen

// Packed argmax layout, shared by kernels, the runtime and tests: element i
// of the tensor (in [B,C,H,W] order) is the window index of its max-pool
// maximum (ky*kw + kx), stored in bits (a power of two) bits of 32-bit word
// i / (32/bits), at bit offset (i % (32/bits)) * bits.

// PackArgmax packs window indices (as the reference keeps them, one float64
// each) into 32-bit words.
func PackArgmax(idx []float64, bits int64) []uint32 {
	per := 32 / bits
	words := make([]uint32, (int64(len(idx))+per-1)/per)
	for i, v := range idx {
		words[int64(i)/per] |= uint32(v) << ((int64(i) % per) * bits)
	}
	return words
}

// UnpackArgmax reverses PackArgmax for n elements.
func UnpackArgmax(words []uint32, bits int64, n int) []float64 {
	per := 32 / bits
	mask := uint32(1)<<bits - 1
	if bits == 32 {
		mask = ^uint32(0)
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(words[int64(i)/per] >> ((int64(i) % per) * bits) & mask)
	}
	return out
}
