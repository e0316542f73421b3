//go:build asan

package native

// asanEnabled: this binary was built with -asan, so kernel libraries compiled at run time are
// built with AddressSanitizer too (as runtime/emu's).
const asanEnabled = true
