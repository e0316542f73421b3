// Package compiler turns a parsed cnnc model into a checked, differentiated
// training step.
//
// In:  a *dsl.File.
// Out: a *Result — the IR graph (forward, backward and optimizer update,
// every tensor typed), the train and data settings, and warnings; or
// dsl.Diagnostics pointing at the user's lines.
//
// How: Lower builds the forward graph from the AST with parameter shapes
// still unknown; then the passes table (passes.go) runs in order —
// shapes, dce, autodiff, and later the fusion and memory passes. Each pass
// is a small function over the graph, the IR verifier runs after every pass
// in tests, and --dump-after prints the IR text after any of them. What is
// specific to an op lives in tables: the DSL signature of each op
// (lower.go), its type rule (ir/ops.go) and its gradient rule
// (autodiff.go).
package compiler
