// Package cpu is the CPU backend of device.Device: the generated CUDA C runs
// on the cores through runtime/emu. A trainer (or a `cnnc gen` package)
// carries its kernels compiled into the binary by go build (see
// emu.BuiltinSource), so New runs no compiler there; other callers (tests,
// tools) get the source compiled with g++ against the emulation header,
// once, into emu's cache. It never links gorgonia.org/cu, so it runs
// anywhere.
package cpu

import (
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/emu"
)

// Device runs kernels from one compiled .cu source.
type Device struct {
	mod *emu.Module
}

var _ device.Device = (*Device)(nil)

// Options are the emulator's compile options.
type Options = emu.Options

// New returns a device that launches source's kernels: those built into
// the program from the same source if there are (and opts ask for no
// other compiler, flags or debug build), else source compiled (named name
// in compiler messages).
func New(source []byte, name string, opts Options) (*Device, error) {
	m, err := emu.Compile(source, name, opts)
	if err != nil {
		return nil, err
	}
	return &Device{mod: m}, nil
}

func (d *Device) Name() string {
	if d.mod.Builtin() {
		return "cpu (CUDA emulator, kernels built in)"
	}
	return "cpu (CUDA emulator)"
}

func (d *Device) Alloc(bytes int64) (device.Ptr, error) {
	p, err := emu.Alloc(int(bytes))
	return device.Ptr(p), err
}

func (d *Device) Free(p device.Ptr) error { return emu.Free(emu.Ptr(p)) }

func (d *Device) CopyIn(dst device.Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return emu.CopyIn(emu.Ptr(dst), src)
}

func (d *Device) CopyOut(dst []byte, src device.Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	return emu.CopyOut(dst, emu.Ptr(src))
}

func (d *Device) Launch(kernel string, grid, block device.Dim3, sharedBytes int, params []uint64) error {
	err := d.mod.Launch(kernel, emu.Dim3{X: grid[0], Y: grid[1], Z: grid[2]}, emu.Dim3{X: block[0], Y: block[1], Z: block[2]}, sharedBytes, params)
	if err != nil {
		return &device.LaunchError{Kernel: kernel, Err: err}
	}
	return nil
}

// Sync returns at once: emulated launches are synchronous.
func (d *Device) Sync() error { return nil }

func (d *Device) Close() error { return d.mod.Close() }
