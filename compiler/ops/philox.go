package ops

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): a counter-based generator. The same (key, counter) always
// gives the same numbers, so a dropout mask recomputed in the backward pass
// or by a rematerialised forward equals the original without storing it.

const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// Philox4x32 returns the 4 words of Philox4x32-10 for counter ctr and key.
func Philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	for i := 0; i < 10; i++ {
		p0 := uint64(philoxM0) * uint64(ctr[0])
		p1 := uint64(philoxM1) * uint64(ctr[2])
		ctr = [4]uint32{
			uint32(p1>>32) ^ ctr[1] ^ key[0],
			uint32(p1),
			uint32(p0>>32) ^ ctr[3] ^ key[1],
			uint32(p0),
		}
		key[0] += philoxW0
		key[1] += philoxW1
	}
	return ctr
}

// DropoutKeep reports whether dropout keeps element i of the given stream
// at the given step: the first Philox word, as a fraction of 2^32, is at
// least p. Kernels compute the same function.
func DropoutKeep(seed uint64, stream, step int64, i int64, p float64) bool {
	w := Philox4x32([4]uint32{uint32(i), uint32(uint64(i) >> 32), uint32(step), uint32(stream)},
		[2]uint32{uint32(seed), uint32(seed >> 32)})
	return float64(w[0]) >= p*4294967296.0
}
