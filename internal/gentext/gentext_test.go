package gentext

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestComment(t *testing.T) {
	for in, want := range map[string]string{
		"examples/mnist.cnn":    "examples/mnist.cnn",
		"../a b/m-1_x.cnn":      "../a b/m-1_x.cnn",
		"bob's *model*?.cnn":    "bob's *model*?.cnn",
		"m\r#include <x>\r.cnn": `"m\r#include <x>\r.cnn"`,
		"m\nfunc init() {}":     `"m\nfunc init() {}"`,
		"m*/ x /*":              `"m\x2a/ x /\x2a"`,
		"m??/":                  `"m\x3f\x3f/"`,
		"m``x''":                `"m\x60\x60x\x27\x27"`,
		`m\`:                    `"m\\"`,
		`m"`:                    `"m\""`,
		"m\x00\xff":             `"m\x00\xff"`,
		"m\u2028\u2029\ufeff":   `"m\u2028\u2029\ufeff"`,
		"模型.cnn":                `"\u6a21\u578b.cnn"`,
		"":                      `""`,
		" m":                    `" m"`,
		"m\t":                   `"m\t"`,
		"\x1b[31mred":           `"\x1b[31mred"`,
	} {
		got := Comment(in)
		assert.Equal(t, want, got, "%q", in)
		checkSafe(t, in, got)
	}
}

// checkSafe: printable ASCII only, nothing that ends or continues a
// comment or that gofmt rewrites, and the original comes back.
func checkSafe(t *testing.T, in, got string) {
	for i := 0; i < len(got); i++ {
		require.True(t, got[i] >= 0x20 && got[i] <= 0x7e, "Comment(%q) = %q", in, got)
	}
	for _, seq := range []string{"*/", "??", "``", "''"} {
		require.NotContains(t, got, seq, "Comment(%q)", in)
	}
	require.False(t, strings.HasSuffix(got, `\`))
	if got != in {
		back, err := strconv.Unquote(got)
		require.NoError(t, err, "Comment(%q) = %q", in, got)
		require.Equal(t, in, back)
	}
}

func FuzzComment(f *testing.F) {
	f.Add("examples/mnist.cnn")
	f.Add("m\r\n*/??/\\\x00\xff\u2028``''")
	f.Fuzz(func(t *testing.T, s string) { checkSafe(t, s, Comment(s)) })
}
