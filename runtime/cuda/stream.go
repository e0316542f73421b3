//go:build cuda

package cuda

import "unsafe"

// OnStream runs f on the device's thread — the one where the device's context is current and
// every driver call of the device is made — with the device's stream, a CUstream as an
// address. It is the way for a library that enqueues work of its own, such as NCCL's
// collectives (runtime/nccl), to order that work with the device's launches and copies, from
// the thread NCCL requires. f must not call the device's methods: they wait for this thread.
func (d *Device) OnStream(f func(stream uintptr) error) error {
	return d.do(func() error {
		// cu.Stream holds only a CUstream (checked at compile time in graph.go)
		return f(*(*uintptr)(unsafe.Pointer(&d.stream)))
	})
}
