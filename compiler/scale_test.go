package compiler

import (
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/dsl"
)

// Generated models that grow in one direction, for the front end's
// scaling tests.
var scaleModels = []struct {
	name string
	gen  func(n int) string
}{
	{"nested calls", func(n int) string {
		return "model M(image: f32[1,4,4], label: class[2]) {\n  a = linear(flatten(" + strings.Repeat("relu(", n) + "image" + strings.Repeat(")", n) +
			"), out=2)\n  loss = cross_entropy(a, label)\n}\n"
	}},
	{"unused layers", func(n int) string {
		var b strings.Builder
		b.WriteString("model M(image: f32[1,4,4], label: class[2]) {\n  a = linear(flatten(image), out=2)\n  loss = cross_entropy(a, label)\n")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "  u%d = relu(image)  # \x1b[31m\n", i)
		}
		b.WriteString("}\n")
		return b.String()
	}},
	{"a chain read before it is defined", func(n int) string {
		var b strings.Builder
		b.WriteString("model M(image: f32[1,4,4], label: class[2]) {\n  a = linear(flatten(r0), out=2)\n  loss = cross_entropy(a, label)\n")
		for i := 0; i < n-1; i++ {
			fmt.Fprintf(&b, "  r%d = relu(r%d)\n", i, i+1)
		}
		fmt.Fprintf(&b, "  r%d = relu(image)\n}\n", n-1)
		return b.String()
	}},
	{"unknown names", func(n int) string {
		var b strings.Builder
		b.WriteString("model M(image: f32[1,4,4], label: class[2]) {\n")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "  r%d = relu(nope%d)\n", i, i)
		}
		b.WriteString("}\n")
		return b.String()
	}},
}

// frontEnd parses, compiles and renders the diagnostics of src, as `cnnc
// check` does, and returns the bytes it allocated and the CPU time the
// process spent meanwhile (user + system: unlike wall time, it does not
// grow with other processes' load on the machine).
func frontEnd(t *testing.T, src string) (uint64, time.Duration) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := processCPU(t)
	res, err := CompileSource("m.cnn", []byte(src), Options{})
	var ds dsl.Diagnostics
	if err != nil {
		require.ErrorAs(t, err, &ds)
	} else {
		ds = res.Warnings
	}
	out := ds.RenderAll(map[string][]byte{"m.cnn": []byte(src)})
	elapsed := processCPU(t) - start
	runtime.ReadMemStats(&after)
	assert.NotContains(t, out, "\x1b")
	return after.TotalAlloc - before.TotalAlloc, elapsed
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var frontEndScales = true

// TestFrontEndIsLinear: four times the input costs about four times the
// memory (allocated bytes do not depend on the machine's load): the old
// front end's nested names and per-diagnostic line splitting made it 16
// times. The bound, 6, leaves room for slice growth and the runtime.
func TestFrontEndIsLinear(t *testing.T) {
	for _, m := range scaleModels {
		t.Run(m.name, func(t *testing.T) {
			small, _ := frontEnd(t, m.gen(5000))
			large, _ := frontEnd(t, m.gen(20000))
			ratio := float64(large) / float64(small)
			t.Logf("%s: %d -> %d bytes allocated (x%.1f)", m.name, small, large, ratio)
			if !assert.Less(t, ratio, 6.0, "allocation grows faster than the input") {
				frontEndScales = false
			}
		})
	}
}

// TestHundredThousandNestedCalls: 100,000 nested calls parse and compile
// in seconds and well under a gigabyte (the old front end: 19 GB in
// 60 s). The bound is on CPU time, so a loaded machine does not fail it
// (the test once failed at 45 s of wall time at a load of 20); about 1 s.
// Skipped if the scaling test failed, which would make this one run away.
func TestHundredThousandNestedCalls(t *testing.T) {
	if !frontEndScales {
		t.Skip("the front end does not scale linearly (TestFrontEndIsLinear); not running 100,000 levels")
	}
	alloc, elapsed := frontEnd(t, scaleModels[0].gen(100000))
	t.Logf("100,000 nested calls: %d bytes allocated, %v of CPU", alloc, elapsed)
	assert.Less(t, alloc, uint64(1<<30))
	assert.Less(t, elapsed, 30*time.Second)
	alloc, elapsed = frontEnd(t, scaleModels[1].gen(40000))
	t.Logf("40,000 unused layers: %d bytes allocated, %v of CPU", alloc, elapsed)
	assert.Less(t, alloc, uint64(1<<30))
	assert.Less(t, elapsed, 30*time.Second, "the old front end took 91 s")
}

// Nested calls are named after their statement and op, numbered when an op
// repeats, so names stay short however deep calls nest — and unique.
func TestNestedCallNames(t *testing.T) {
	src := "model M(image: f32[1,4,4], label: class[2]) {\n  a = linear(flatten(add(relu(relu(image)), relu(image))), out=2)\n  loss = cross_entropy(a, label)\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{StopAfter: "shapes"})
	require.NoError(t, err)
	var names []string
	for _, n := range res.Graph.Nodes {
		names = append(names, n.Out().Name)
	}
	assert.Equal(t, []string{"a.relu_2", "a.relu", "a.relu_3", "a.add", "a.flatten", "a", "loss"}, names)
}
