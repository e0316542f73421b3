//go:build asan

package emu

// asanEnabled: this binary was built with -asan, so kernel libraries are compiled with
// AddressSanitizer too (a library built without it would not see the checked allocations'
// redzones, and one built with it cannot load into a binary without it).
const asanEnabled = true
