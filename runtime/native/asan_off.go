//go:build !asan

package native

// asanEnabled: see asan_on.go.
const asanEnabled = false
