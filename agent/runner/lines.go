package runner

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

// lineReader splits a runner's stdout into lines of any size up to max,
// without bufio.Scanner's fixed 64 KiB token limit. A longer line is
// skipped to its end and reported as errLineTooLong, so the call can fail
// with a clear answer instead of the agent running out of memory.
type lineReader struct {
	r   *bufio.Reader
	max int64
	buf []byte
}

// lineBufferSize is the read buffer: large enough that a typical event is
// one ReadSlice with no copying into buf.
const lineBufferSize = 64 << 10

type lineTooLongError struct{ max int64 }

func (e *lineTooLongError) Error() string {
	return fmt.Sprintf("the node sent a line longer than --max-line (%s); save large outputs with fluksio.save_artifact, or raise --max-line", logging.FormatBytes(e.max))
}

func newLineReader(r io.Reader, max int64) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, lineBufferSize), max: max}
}

// Next returns the next line without its newline. The slice is valid until
// the next call. At the end of input it returns io.EOF (a final line
// without a newline is returned first).
func (lr *lineReader) Next() ([]byte, error) {
	line, err := lr.r.ReadSlice('\n')
	switch {
	case err == nil:
		return lr.bounded(line[:len(line)-1])
	case errors.Is(err, io.EOF) && len(line) > 0:
		return lr.bounded(line)
	case !errors.Is(err, bufio.ErrBufferFull):
		return nil, err
	}
	lr.buf = append(lr.buf[:0], line...)
	for {
		line, err = lr.r.ReadSlice('\n')
		if int64(len(lr.buf)+len(line)) > lr.max+1 {
			lr.buf = nil // do not keep a huge buffer alive
			if err != nil {
				if skipErr := lr.skipLine(err); skipErr != nil {
					return nil, skipErr
				}
			}
			return nil, &lineTooLongError{lr.max}
		}
		lr.buf = append(lr.buf, line...)
		switch {
		case err == nil:
			return lr.bounded(lr.buf[:len(lr.buf)-1])
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(lr.buf) > 0:
			return lr.bounded(lr.buf)
		default:
			return nil, err
		}
	}
}

// bounded passes a complete line that fits and refuses one that does not.
func (lr *lineReader) bounded(line []byte) ([]byte, error) {
	if int64(len(line)) > lr.max {
		return nil, &lineTooLongError{lr.max}
	}
	return line, nil
}

// skipLine discards input up to and including the next newline.
func (lr *lineReader) skipLine(err error) error {
	for errors.Is(err, bufio.ErrBufferFull) {
		_, err = lr.r.ReadSlice('\n')
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// textFrame makes a line safe to send as a WebSocket text frame, which must
// be UTF-8: invalid bytes become U+FFFD, and the rest of the line gets
// through.
func textFrame(line []byte) []byte {
	if utf8.Valid(line) {
		return append(getFrame(len(line)), line...)
	}
	return bytes.ToValidUTF8(line, []byte("\uFFFD"))
}

// Frames are recycled: a chatty node sends tens of thousands of events a
// second, and a fresh buffer for each would be most of what the worker
// allocates (and so of its resident memory, through the collector's
// headroom). A frame handed to Spec.Send is owned by the socket's writer,
// which puts it back with PutFrame once written.
//
// The pool holds *[]byte, and the boxes themselves are recycled through
// frameBoxes: putting a frame back into the pool costs no allocation, so
// relaying an event allocates nothing here (a new box for each put would
// be 24 bytes an event, a collection every ~170,000 events).
var (
	framePool  = sync.Pool{New: func() any { return new([]byte) }}
	frameBoxes = sync.Pool{New: func() any { return new([]byte) }}
)

// maxPooledFrame keeps answers of many MiB out of the pool.
const maxPooledFrame = 16 << 10

func getFrame(n int) []byte {
	if n > maxPooledFrame {
		return make([]byte, 0, n)
	}
	box := framePool.Get().(*[]byte)
	frame := (*box)[:0]
	*box = nil
	frameBoxes.Put(box)
	return frame
}

// PutFrame gives back a frame Spec.Send was handed, once it is written.
func PutFrame(frame []byte) {
	if cap(frame) == 0 || cap(frame) > maxPooledFrame {
		return
	}
	box := frameBoxes.Get().(*[]byte)
	*box = frame
	framePool.Put(box)
}
