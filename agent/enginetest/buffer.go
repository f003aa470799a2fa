package enginetest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that a worker's goroutines (or a process's
// output copier) may write while a test reads it: where tests collect a
// worker's log or a machine's console.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
