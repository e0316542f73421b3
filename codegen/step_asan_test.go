//go:build asan

package codegen_test

// underASan: this test binary was built with -asan (make test-asan). The
// Go float64 reference then runs about 20 times slower, so the largest
// whole-step check runs one step instead of two (the kernels' memory
// accesses are what ASan is there to check).
const underASan = true
