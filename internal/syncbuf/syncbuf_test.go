package syncbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Concurrent writers and readers: under -race this fails if the buffer is not locked, and
// every write must arrive whole.
func TestConcurrentWritesArriveWhole(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, err := b.Write([]byte("abc\n"))
				require.NoError(t, err)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, strings.Repeat("abc\n", 800), b.String())
}
