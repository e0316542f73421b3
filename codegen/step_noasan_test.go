//go:build !asan

package codegen_test

// underASan: see step_asan_test.go.
const underASan = false
