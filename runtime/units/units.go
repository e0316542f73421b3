// Package units parses and prints memory sizes, for the DSL's
// memory_budget, cnnc's --memory-budget and the trainers' (which carry only
// runtime/, so the parser lives here rather than in dsl).
package units

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"kB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// ParseSize parses a memory size such as "64MiB", "40MB", "1.5GiB" or
// "1024" (bytes). KB (or kB, as FormatBytes prints it)/MB/GB are powers of 1000 (as PyTorch and nvidia-smi
// print them); KiB/MiB/GiB are powers of 1024.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok || r.Sign() < 0 || num == "" {
		return 0, fmt.Errorf("bad memory size %q (write e.g. 64MiB, 40MB, 2GiB)", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("memory size %q is not a whole number of bytes", s)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("memory size %q is too large", s)
	}
	return r.Num().Int64(), nil
}

// FormatSize prints bytes with the largest binary unit that keeps 3
// significant digits, e.g. "14.1 MiB".
func FormatSize(n int64) string {
	f := float64(n)
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", f/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", f/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2f KiB", f/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// FormatBytes prints a byte count in the decimal unit that fits (B, kB,
// MB, GB, TB, as PyTorch and nvidia-smi count), with two decimals:
// "512 B", "47.37 MB", "8.00 GB". The unit is chosen after rounding, so
// 999,999,999 bytes print as "1.00 GB", never "1000.00 MB". Every size a
// user reads (cnnc's reports, trainers) goes through it, so one size
// always prints one way.
func FormatBytes(n int64) string {
	if n < 0 {
		return "-" + FormatBytes(-n)
	}
	if n < 1000 {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	units := []string{"kB", "MB", "GB", "TB"}
	for i, u := range units {
		f /= 1000
		if math.Round(f*100) < 1000*100 || i == len(units)-1 {
			return fmt.Sprintf("%.2f %s", f, u)
		}
	}
	panic("unreachable")
}
