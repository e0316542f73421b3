package ops

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDropoutMaskIsCounterBased(t *testing.T) {
	kept := 0
	for i := int64(0); i < 100000; i++ {
		k := DropoutKeep(9, 2, 5, i, 0.3)
		assert.Equal(t, k, DropoutKeep(9, 2, 5, i, 0.3))
		if k {
			kept++
		}
	}
	assert.InDelta(t, 0.7, float64(kept)/100000, 0.01)
	same := 0
	for i := int64(0); i < 1000; i++ {
		if DropoutKeep(9, 2, 5, i, 0.5) == DropoutKeep(9, 2, 6, i, 0.5) {
			same++
		}
	}
	assert.InDelta(t, 500, same, 80, "another step gives another mask")
}

// Philox4x32-10 known-answer vectors from the Random123 distribution.
func TestPhiloxKnownAnswers(t *testing.T) {
	assert.Equal(t, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}, Philox4x32([4]uint32{}, [2]uint32{}))
	assert.Equal(t, [4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
		Philox4x32([4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff}))
	assert.Equal(t, [4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
		Philox4x32([4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0}))
}
