package plan_test

import (
	"testing"

	"github.com/cnnc/cnnc/compiler/plan"
)

// BenchmarkPlanSimpleCNN times planning the guide's model (BENCHMARKS.md):
// go test ./compiler/plan -run '^$' -bench PlanSimpleCNN
func BenchmarkPlanSimpleCNN(b *testing.B) {
	g := compileFile(b, "../../examples/simplecnn.cnn").Graph
	for _, c := range []struct {
		name string
		cfg  plan.Config
	}{
		{"batch32", plan.Config{Batch: 32}},
		{"batch32_budget40MB", plan.Config{Batch: 32, Budget: 40e6}},
		{"batch32_budget44MB", plan.Config{Batch: 32, Budget: 44e6}},
		{"batch256", plan.Config{Batch: 256}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := plan.Build(g, c.cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("max_batch_40MB", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := plan.FindMaxBatch(g, 40e6, 0, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
