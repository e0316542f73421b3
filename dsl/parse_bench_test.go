package dsl

import (
	"fmt"
	"strings"
	"testing"
)

// Parse's speed on the shapes the scaling tests use: deep nesting and
// many statements (BENCHMARKS.md, "Parsing").

func benchmarkParse(b *testing.B, src []byte) {
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Parse("m.cnn", src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseNested: 100,000 nested calls, as TestDeepNestingIsLinear.
func BenchmarkParseNested(b *testing.B) {
	const n = 100000
	benchmarkParse(b, []byte("model M(image: f32[1,4,4], label: class[2]) {\n  a = "+
		strings.Repeat("relu(", n)+"image"+strings.Repeat(")", n)+"\n}\n"))
}

// BenchmarkParseLayers: 40,000 statements of a call, a nested call,
// keyword arguments and a comment (2 MB).
func BenchmarkParseLayers(b *testing.B) {
	var s strings.Builder
	s.WriteString("model M(image: f32[1,4,4], label: class[2]) {\n")
	for i := 0; i < 40000; i++ {
		fmt.Fprintf(&s, "  u%d = linear(relu(image), out=2, bias=true)  # layer %d\n", i, i)
	}
	s.WriteString("}\n")
	benchmarkParse(b, []byte(s.String()))
}
