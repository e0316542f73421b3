package trainer

import "github.com/cnnc/cnnc/runtime/device"

// ArenaAddr is the device address of offset off in one of s's arenas, for
// tests that read raw arena bytes.
func ArenaAddr(s *Session, a Arena, off int64) device.Ptr { return s.addr(a, off) }
