package units_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/runtime/units"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"64MiB": 64 << 20, "40MB": 40e6, "1.5GiB": 3 << 29, "1024": 1024, " 2 GB ": 2e9,
		"1TiB": 1 << 40, "0.5KB": 500, "7B": 7, "80GB": 80e9, "12 kB": 12e3,
		"9007199254740993B": 9007199254740993, // exact beyond float64's integers
	} {
		got, err := units.ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for in, msg := range map[string]string{
		"lots":       `bad memory size "lots" (write e.g. 64MiB, 40MB, 2GiB)`,
		"-1MB":       `bad memory size "-1MB"`,
		"MB":         `bad memory size "MB"`,
		"0.3B":       `memory size "0.3B" is not a whole number of bytes`,
		"9999999TiB": `memory size "9999999TiB" is too large`,
	} {
		_, err := units.ParseSize(in)
		assert.ErrorContains(t, err, msg, in)
	}
}

func TestFormatSize(t *testing.T) {
	assert.Equal(t, "512 B", units.FormatSize(512))
	assert.Equal(t, "1.50 KiB", units.FormatSize(1536))
	assert.Equal(t, "14.10 MiB", units.FormatSize(14784921))
	assert.Equal(t, "2.00 GiB", units.FormatSize(2<<30))
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 999: "999 B", 1000: "1.00 kB", 47370000: "47.37 MB", 8000e6: "8.00 GB",
		60906690000: "60.91 GB", 999_994_999: "999.99 MB", 999_995_000: "1.00 GB",
		4e15: "4000.00 TB", -1500: "-1.50 kB",
	} {
		assert.Equal(t, want, units.FormatBytes(n), n)
	}
}

// What FormatBytes prints, ParseSize reads back (to the printed precision).
func TestFormatBytesParsesBack(t *testing.T) {
	for _, n := range []int64{0, 999, 1000, 12_340, 47_370_000, 8e9, 3e12} {
		got, err := units.ParseSize(units.FormatBytes(n))
		require.NoError(t, err, units.FormatBytes(n))
		assert.InDelta(t, float64(n), float64(got), 0.005*float64(n)+0.5, units.FormatBytes(n))
	}
}
