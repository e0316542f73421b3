// Package syncbuf is a text buffer that several goroutines may write and
// read at once: tests hand it to launched processes (their stdout and
// stderr are copied by goroutines of os/exec) while they poll what has
// been printed so far.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer whose String may be called while writes go on.
// The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p; it never fails.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
