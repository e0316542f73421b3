//go:build cuda

package cuda_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/runtime/cuda"
)

// HeaderVersionEnv, when set (make test-cuda-headers), is the CUDA_VERSION
// the package must have been compiled with: proof that a build meant for
// other headers really used them.
const headerVersionEnv = "CNNC_CUDA_HEADER_VERSION"

// The entry points resolve on this driver, at the ABI versions driver.c
// names, and the binary reports the headers it was built with.
func TestDriverEntryPoints(t *testing.T) {
	v, err := cuda.DriverVersion()
	require.NoError(t, err)
	t.Logf("driver CUDA %s, headers CUDA %s", cuda.CUDAVersion(v), cuda.CUDAVersion(cuda.HeaderVersion()))
	assert.GreaterOrEqual(t, v, 11040)
	assert.GreaterOrEqual(t, cuda.HeaderVersion(), 11040)
	if want := os.Getenv(headerVersionEnv); want != "" {
		assert.Equal(t, want, strconv.Itoa(cuda.HeaderVersion()), "the package was compiled with other headers than the build asked for")
	}
	assert.Equal(t, []cuda.EntryPoint{
		{"cuCtxCreate", 3020}, {"cuCtxDestroy", 4000}, {"cuStreamBeginCapture", 10010},
		{"cuStreamGetCaptureInfo", 11030}, {"cuGraphInstantiateWithFlags", 11040},
		{"cuGraphExecKernelNodeSetParams", 10010},
	}, cuda.EntryPoints())
	assert.Equal(t, "12.4", cuda.CUDAVersion(12040))
	assert.Equal(t, "11.8", cuda.CUDAVersion(11080))
	assert.Equal(t, "13.0", cuda.CUDAVersion(13000))
}

// driverChild opens a device in a child process (the entry points are
// resolved once per process) under a fake driver set up by the parent.
const driverChild = "CNNC_CUDA_TEST_DRIVER_CHILD"

func TestDriverChild(t *testing.T) {
	if os.Getenv(driverChild) == "" {
		t.Skip("run by TestDriverTooOldOrIncomplete")
	}
	// Resolving the driver comes before loading the kernels, so any image
	// will do: a driver that passes fails on this one instead.
	_, err := cuda.New([]byte("not a fatbin"))
	fmt.Printf("OPEN: %v\n", err)
}

// A driver older than the binary needs, or one without an entry point,
// stops New with a message that says which driver is needed (fake driver
// only: it can pretend to be an old driver).
func TestDriverTooOldOrIncomplete(t *testing.T) {
	if fakecuda.Dir() == "" {
		t.Skip("needs the fake driver (make test-fakecuda) to act as an old one")
	}
	minimum := "11.4"
	if cuda.HeaderVersion() >= 12000 {
		minimum = "12.0" // cuGetProcAddress_v2
	}
	for _, c := range []struct{ env, want string }{
		{"CNNC_FAKECUDA_DRIVER_VERSION=11020", "the CUDA driver is 11.2; this binary (built with CUDA " +
			cuda.CUDAVersion(cuda.HeaderVersion()) + " headers) needs a driver for CUDA " + minimum + " or newer"},
		{"CNNC_FAKECUDA_HIDE=cuStreamGetCaptureInfo", "has no cuStreamGetCaptureInfo of the CUDA 11.3 ABI"},
	} {
		t.Run(c.env, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestDriverChild$", "-test.v")
			cmd.Env = append(os.Environ(), driverChild+"=1", c.env)
			out, _ := cmd.CombinedOutput()
			t.Logf("%s", out)
			assert.Contains(t, string(out), "OPEN: cuda: ")
			assert.Contains(t, string(out), c.want)
		})
	}
	// the same child with the driver as it is gets past the driver check
	cmd := exec.Command(os.Args[0], "-test.run=^TestDriverChild$", "-test.v")
	cmd.Env = append(os.Environ(), driverChild+"=1")
	out, _ := cmd.CombinedOutput()
	assert.Contains(t, string(out), "loading the kernels", string(out))
}
