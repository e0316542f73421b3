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
// shapes, dce, autodiff, fuse — under order constraints checked when the
// package initialises (passOrder). Each pass is a small function over the
// graph, the IR verifier runs after every pass (RunPasses), and
// --dump-after prints the IR text after any of them. Memory planning
// follows in package compiler/plan, which reads the fused graph and writes
// a Plan, not IR. What is specific to an op lives in one file of the op
// registry (compiler/ops): its DSL signature, type rule, gradient rule,
// float64 reference and kernel binding; lower.go, autodiff.go and fuse.go
// read it.
package compiler
