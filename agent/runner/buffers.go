package runner

import (
	"bufio"
	"io"
	"sync"
)

// Read buffers are recycled from call to call: a call's relays read its
// runner's pipes through buffers of tens of KiB, which were most of what
// the worker allocated per call (about 270 KiB of about 350 KiB), and so
// most of its collections (one every two or three calls back to back).

// readerPool recycles buffered readers of one size.
type readerPool struct {
	size int
	pool sync.Pool
}

// readerPools: the runner's stdout (lineBufferSize) and its stderr.
var (
	stdoutReaders = &readerPool{size: lineBufferSize}
	stderrReaders = &readerPool{size: 16 << 10}
)

// get is a reader of r with the pool's buffer size.
func (rp *readerPool) get(r io.Reader) *bufio.Reader {
	if br, ok := rp.pool.Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, rp.size)
}

// put gives br back; nothing may hold a slice of its buffer.
func (rp *readerPool) put(br *bufio.Reader) {
	br.Reset(nil) // the pipe is not kept alive by the pool
	rp.pool.Put(br)
}

// nodeReadSize is what the node's output pipes are read with at once.
const nodeReadSize = 64 << 10

// nodeReadBuffers recycles the buffer a call's node output is read into.
var nodeReadBuffers = sync.Pool{New: func() any { return new([nodeReadSize]byte) }}
