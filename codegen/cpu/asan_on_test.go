//go:build asan

package cpu_test

// asanBuild: this test binary was built with -asan (make test-asan), so the CPU target's kernels
// are compiled with AddressSanitizer at -O1 (runtime/native): another build of them.
const asanBuild = true
