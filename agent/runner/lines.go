package runner

import (
	"bufio"
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
// be UTF-8: invalid bytes become U+FFFD (appendValidUTF8), and the rest of
// the line gets through.
func textFrame(line []byte) []byte {
	if utf8.Valid(line) {
		return append(frame.Get(len(line)), line...)
	}
	return appendValidUTF8(frame.Get(len(line)+len(line)/2), line)
}

// appendValidUTF8 appends s to dst with each maximal subpart of an
// ill-formed sequence replaced by one U+FFFD, as Python's
// bytes.decode("utf-8", "replace") and the WHATWG decoder do (the Unicode
// Standard's recommended practice, chapter 3): b"\xe2\x82", a character
// cut short, is one U+FFFD; b"\xff\xfe", two bytes no character starts
// with, is two. (bytes.ToValidUTF8 makes one of any run of invalid bytes;
// encoding/json one of each byte.)
func appendValidUTF8(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, s[i:i+n]...)
			i += n
			continue
		}
		dst = append(dst, "\uFFFD"...)
		i += maximalSubpart(s[i:])
	}
	return dst
}

// maximalSubpart is the length of the ill-formed sequence that s starts
// with: its first byte, and the bytes after it that a well-formed sequence
// starting with that byte could still have had there.
func maximalSubpart(s []byte) int {
	lo, hi := byte(0x80), byte(0xBF) // what may follow the first byte
	need := 0                        // continuation bytes its character has
	switch b := s[0]; {
	case b >= 0xC2 && b <= 0xDF:
		need = 1
	case b == 0xE0:
		need, lo = 2, 0xA0 // no overlong form
	case b == 0xED:
		need, hi = 2, 0x9F // no surrogate
	case b >= 0xE1 && b <= 0xEF:
		need = 2
	case b == 0xF0:
		need, lo = 3, 0x90 // no overlong form
	case b == 0xF4:
		need, hi = 3, 0x8F // nothing past U+10FFFF
	case b >= 0xF1 && b <= 0xF3:
		need = 3
	}
	n := 1
	for n <= need && n < len(s) && s[n] >= lo && s[n] <= hi {
		n++
		lo, hi = 0x80, 0xBF
	}
	return n
}
