package runner

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/frame"
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
	return &lineReader{r: stdoutReaders.get(r), max: max}
}

// release gives the read buffer back for another call's reader: no line
// it returned may be used after.
func (lr *lineReader) release() {
	if lr.r != nil {
		stdoutReaders.put(lr.r)
		lr.r = nil
	}
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
		return append(frame.Get(len(line)), line...)
	}
	return bytes.ToValidUTF8(line, []byte("\uFFFD"))
}
