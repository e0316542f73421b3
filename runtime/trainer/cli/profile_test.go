package cli_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --profile N prints, after N steps, the kernels' times and the host gap
// of the steps before: on the emulator from the host's clock, over the
// N-1 steps that had one before them.
func TestProfileShowsTheHostGap(t *testing.T) {
	spec, root := tiny(t)
	r := run(t, spec, "--data", root, "--profile", "3", "--quiet")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "profile of one step on cpu (CUDA emulator)")
	assert.Contains(t, r.out, "host gap per step over 2 steps, from the host's clock from one step's end to the next step's launch")
	assert.Regexp(t, `\n  gap:  median \d+\.\d{3} ms, 90th percentile \d+\.\d{3} ms, max \d+\.\d{3} ms\n`, r.out)
	assert.Regexp(t, `\n  step: median \d+\.\d{3} ms, 90th percentile \d+\.\d{3} ms, max \d+\.\d{3} ms\n`, r.out)
}

// --bench times each step alone, then steps submitted one after the other
// as training runs them (on the emulator: one at a time); with --profile
// the host gap of those.
func TestBenchTimesThePipelinedSteps(t *testing.T) {
	spec, _ := tiny(t)
	r := run(t, spec, "--bench", "2")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "bench: Tiny on cpu (CUDA emulator), batch 4: median step")
	assert.Regexp(t, `bench: pipelined \(2 steps submitted without waiting, 1 queued at a time\): \d+\.\d{3} ms per step, \d+ images/s \(wall clock\)`, r.out)
	r = run(t, spec, "--bench", "3", "--profile", "1")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "host gap per step over 2 steps")
}
