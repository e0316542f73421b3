package trainergen

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cnnc/cnnc/compiler/plan"
)

// Where the plan leaves no free bytes the block goes after the arena; it
// prefers the bytes right after an input (one copy for both) to other holes.
func TestScalarsPlace(t *testing.T) {
	full := &plan.Plan{ArenaBytes: 1000, Buffers: []*plan.Buffer{{Offset: 0, Bytes: 600}, {Offset: 512, Bytes: 488}}}
	at, grown := scalarsPlace(full, nil)
	assert.Equal(t, int64(1000), at)
	assert.Equal(t, int64(1032), grown)

	holes := &plan.Plan{ArenaBytes: 1024, Buffers: []*plan.Buffer{{Offset: 0, Bytes: 40}, {Offset: 256, Bytes: 96}, {Offset: 512, Bytes: 512}}}
	at, grown = scalarsPlace(holes, nil)
	assert.Equal(t, int64(40), at, "the first hole")
	assert.Zero(t, grown)
	at, _ = scalarsPlace(holes, []span{{256, 96}})
	assert.Equal(t, int64(352), at, "right after the input")
	odd := &plan.Plan{ArenaBytes: 1024, Buffers: []*plan.Buffer{{Offset: 0, Bytes: 40}, {Offset: 256, Bytes: 100}, {Offset: 512, Bytes: 512}}}
	at, _ = scalarsPlace(odd, []span{{256, 100}})
	assert.Equal(t, int64(40), at, "an input that ends off the 8-byte grid cannot be followed directly")
}
