package emu

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"unsafe"
)

// Ptr is an emulated device pointer: the address of C memory from Alloc. Pointer arithmetic
// (p + offset) is allowed; copies check that they stay inside one allocation.
type Ptr uintptr

// Every allocation is its own C allocation so that AddressSanitizer (go test -asan) reports
// kernel accesses past its end; an arena would hide overflows into the neighbouring buffer.
var allocs struct {
	sync.Mutex
	spans []span // sorted by base
}

type span struct {
	base Ptr
	size int
}

// ErrBadPointer: a pointer or range outside every live allocation.
var ErrBadPointer = errors.New("emu: pointer outside any allocation")

// Alloc allocates bytes of emulated device memory, 256-byte aligned like cuMemAlloc. The
// contents are undefined.
func Alloc(bytes int) (Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("emu: Alloc(%d): size must be positive", bytes)
	}
	p := Ptr(cAlloc(bytes))
	if p == 0 {
		return 0, fmt.Errorf("emu: Alloc(%d): out of memory", bytes)
	}
	allocs.Lock()
	i := sort.Search(len(allocs.spans), func(i int) bool { return allocs.spans[i].base > p })
	allocs.spans = append(allocs.spans, span{})
	copy(allocs.spans[i+1:], allocs.spans[i:])
	allocs.spans[i] = span{p, bytes}
	allocs.Unlock()
	return p, nil
}

// Free releases memory from Alloc.
func Free(p Ptr) error {
	allocs.Lock()
	i := sort.Search(len(allocs.spans), func(i int) bool { return allocs.spans[i].base >= p })
	if i == len(allocs.spans) || allocs.spans[i].base != p {
		allocs.Unlock()
		return fmt.Errorf("%w: Free(%#x)", ErrBadPointer, uintptr(p))
	}
	allocs.spans = append(allocs.spans[:i], allocs.spans[i+1:]...)
	allocs.Unlock()
	cFree(uintptr(p))
	return nil
}

// checkRange reports whether [p, p+n) lies inside one live allocation.
func checkRange(p Ptr, n int) error {
	allocs.Lock()
	defer allocs.Unlock()
	i := sort.Search(len(allocs.spans), func(i int) bool { return allocs.spans[i].base > p }) - 1
	if i < 0 || n < 0 || uint64(p-allocs.spans[i].base)+uint64(n) > uint64(allocs.spans[i].size) {
		return fmt.Errorf("%w: %d bytes at %#x", ErrBadPointer, n, uintptr(p))
	}
	return nil
}

// Scalar is an element type that can be copied to and from emulated device memory.
type Scalar interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// CopyIn copies a slice into device memory at dst.
func CopyIn[T Scalar](dst Ptr, src []T) error {
	n := len(src) * int(unsafe.Sizeof(*new(T)))
	if n == 0 {
		return nil
	}
	if err := checkRange(dst, n); err != nil {
		return err
	}
	cCopyIn(uintptr(dst), unsafe.Pointer(&src[0]), n)
	return nil
}

// CopyOut fills a slice from device memory at src.
func CopyOut[T Scalar](dst []T, src Ptr) error {
	n := len(dst) * int(unsafe.Sizeof(*new(T)))
	if n == 0 {
		return nil
	}
	if err := checkRange(src, n); err != nil {
		return err
	}
	cCopyOut(unsafe.Pointer(&dst[0]), uintptr(src), n)
	return nil
}

// Memset sets n bytes at dst to v.
func Memset(dst Ptr, v byte, n int) error {
	if err := checkRange(dst, n); err != nil {
		return err
	}
	cMemset(uintptr(dst), v, n)
	return nil
}

// AllocCopy allocates device memory holding a copy of src.
func AllocCopy[T Scalar](src []T) (Ptr, error) {
	p, err := Alloc(max(1, len(src)) * int(unsafe.Sizeof(*new(T))))
	if err != nil {
		return 0, err
	}
	if err := CopyIn(p, src); err != nil {
		_ = Free(p)
		return 0, err
	}
	return p, nil
}

// CopyInFloat32 and CopyOutFloat32 are CopyIn and CopyOut for the common []float32 case.
func CopyInFloat32(dst Ptr, src []float32) error  { return CopyIn(dst, src) }
func CopyOutFloat32(dst []float32, src Ptr) error { return CopyOut(dst, src) }

// ReadFloat32 returns n float32 values at src.
func ReadFloat32(src Ptr, n int) ([]float32, error) {
	out := make([]float32, n)
	return out, CopyOut(out, src)
}
