package kernelarg_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// trainergen spells a kind in generated Go as kernelarg.<String()>: the
// names must be the constants'.
func TestStringNamesTheConstant(t *testing.T) {
	assert.Equal(t, "Buffer", kernelarg.Buffer.String())
	assert.Equal(t, "Int", kernelarg.Int.String())
	assert.Equal(t, "Float", kernelarg.Float.String())
	assert.Equal(t, "Scalars", kernelarg.Scalars.String())
	assert.Equal(t, "Kind(9)", kernelarg.Kind(9).String())
}
