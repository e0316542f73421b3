//go:build !asan

package emu

// asanEnabled: see asan_on.go.
const asanEnabled = false
