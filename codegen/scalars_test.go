package codegen

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// The kernels' CnncStepScalars (templates/prelude.cu.tmpl) and the
// runtime's device.StepScalars lay the block out alike: a kernel reading
// each field of a block the runtime wrote gets its values back.
func TestStepScalarsLayout(t *testing.T) {
	var src bytes.Buffer
	require.NoError(t, tmpl.ExecuteTemplate(&src, "step_scalars", nil))
	src.WriteString(`
extern "C" __global__ void read_scalars(const CnncStepScalars* __restrict__ scalars, long long* out) {
    out[0] = scalars->step;
    out[1] = (long long)scalars->seed;
    out[2] = scalars->valid;
    out[3] = (long long)(scalars->lr * 1048576.0f);
}
`)
	dev, err := cpu.New(src.Bytes(), "scalars.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	// values that fill their fields' high bytes
	want := device.StepScalars{Step: 1<<40 + 3, Seed: math.MaxUint64 - 5, Valid: 1<<33 + 7, LR: 0.375}
	block, err := dev.Alloc(device.StepScalarsBytes)
	require.NoError(t, err)
	require.NoError(t, dev.CopyIn(block, want.Bytes()))
	out, err := dev.Alloc(32)
	require.NoError(t, err)
	require.NoError(t, dev.Launch("read_scalars", device.Dim3{1, 1, 1}, device.Dim3{1, 1, 1}, 0, []uint64{uint64(block), uint64(out)}))
	got := make([]byte, 32)
	require.NoError(t, dev.CopyOut(got, out))
	assert.Equal(t, want.Step, int64(binary.LittleEndian.Uint64(got[0:])))
	assert.Equal(t, want.Seed, binary.LittleEndian.Uint64(got[8:]))
	assert.Equal(t, want.Valid, int64(binary.LittleEndian.Uint64(got[16:])))
	assert.Equal(t, int64(0.375*1048576), int64(binary.LittleEndian.Uint64(got[24:])))
}
