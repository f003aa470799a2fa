package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// Fuzz tests of what the runner and the engine send the agent. Without
// -fuzz, `go test` runs the seeds below; CI runs each fuzzer for a while:
//
//	go test -run '^$' -fuzz FuzzLineReader -fuzztime 10s ./agent/runner/

// chunkReader hands out input in the sizes sizes cycles through, so lines
// end up split across reads every possible way.
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.sizes) > 0 {
		c := int(r.sizes[r.i%len(r.sizes)])
		r.i++
		n = c + 1 // 1 to 200 bytes
		if c > 200 {
			n = (c - 200) * 4096 // up to 220 KiB, across the 64 KiB buffer
		}
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// stretchInput replaces each 0xFF byte with a run of run 'x' bytes, so the
// fuzzer can reach lines around the 64 KiB buffer with small inputs.
func stretchInput(data []byte, run uint16) []byte {
	if bytes.IndexByte(data, 0xFF) < 0 {
		return data
	}
	fill := bytes.Repeat([]byte{'x'}, int(run))
	return bytes.ReplaceAll(data, []byte{0xFF}, fill)
}

// expectedLines is what a reader bounded to max must give for input: each
// newline-terminated line (and a final unterminated one), or nil for a
// line over the bound.
func expectedLines(input []byte, max int64) [][]byte {
	if len(input) == 0 {
		return nil
	}
	parts := bytes.Split(input, []byte{'\n'})
	if len(parts[len(parts)-1]) == 0 {
		parts = parts[:len(parts)-1]
	}
	for i, p := range parts {
		if int64(len(p)) > max {
			parts[i] = nil
		} else if p == nil {
			parts[i] = []byte{}
		}
	}
	return parts
}

func FuzzLineReader(f *testing.F) {
	k64 := uint32(lineBufferSize)
	f.Add([]byte("a\nbb\nccc\n"), []byte{0}, uint32(2), uint16(0))
	f.Add([]byte("{\"event\":\"log\"}\r\n{\"ok\":true}"), []byte{3, 7}, uint32(1024), uint16(0))
	f.Add([]byte(""), []byte{}, uint32(16), uint16(0))
	f.Add([]byte("\n\n\n"), []byte{}, uint32(0), uint16(0))
	f.Add([]byte("short\nway too long a line\nok\n"), []byte{5}, uint32(7), uint16(0))
	f.Add([]byte("over at EOF"), []byte{200}, uint32(5), uint16(0))
	f.Add([]byte("exact\nexact!"), []byte{1}, uint32(5), uint16(0))
	// Around the 64 KiB buffer: a line of 0xFF's run.
	f.Add([]byte("a\n\xff\nb\n"), []byte{210}, k64-1, uint16(k64-1))
	f.Add([]byte("a\n\xff\nb\n"), []byte{255}, k64, uint16(k64-1))
	f.Add([]byte("\xff\xff\nb"), []byte{201, 0}, k64+3, uint16(k64/2+1))
	f.Add([]byte("\xff\xff\xff\nnext\n\xff"), []byte{220, 13}, 2*k64+1, uint16(65535))
	f.Add([]byte("\xff\xffz\nnext\n"), []byte{250}, uint32(100_000), uint16(50_000))
	f.Add([]byte("\xff\nq\n\xff\xff"), []byte{7, 230}, uint32(1024), uint16(4000))

	f.Fuzz(func(t *testing.T, data, sizes []byte, maxSel uint32, run uint16) {
		input := stretchInput(data, run)
		if len(input) > 8<<20 {
			t.Skip("input too large to be useful")
		}
		max := int64(maxSel%(3*uint32(lineBufferSize))) + 1
		want := expectedLines(input, max)

		lr := newLineReader(&chunkReader{data: input, sizes: sizes}, max)
		var got [][]byte
		for {
			if len(got) > len(want)+1 {
				t.Fatalf("more results than lines: got %d, want %d", len(got), len(want))
			}
			line, err := lr.Next()
			var tooLong *lineTooLongError
			switch {
			case err == nil:
				if int64(len(line)) > max {
					t.Fatalf("line of %d bytes returned with --max-line %d", len(line), max)
				}
				got = append(got, append([]byte{}, line...))
				continue
			case errors.As(err, &tooLong):
				got = append(got, nil)
				continue
			case !errors.Is(err, io.EOF):
				t.Fatalf("Next: %v", err)
			}
			break
		}
		if len(got) != len(want) {
			t.Fatalf("max %d: got %d results, want %d", max, len(got), len(want))
		}
		for i := range want {
			switch {
			case want[i] == nil && got[i] != nil:
				t.Fatalf("max %d: line %d has %d bytes, over the bound, but was returned", max, i, len(got[i]))
			case want[i] != nil && got[i] == nil:
				t.Fatalf("max %d: line %d (%d bytes) refused as too long", max, i, len(want[i]))
			case !bytes.Equal(want[i], got[i]):
				t.Fatalf("max %d: line %d is %q, want %q", max, i, logging.Cut(got[i], 80), logging.Cut(want[i], 80))
			}
		}
	})
}

// FuzzTextFrame: whatever line the runner writes that the protocol
// forwards, the frame made of it is a UTF-8 JSON object.
func FuzzTextFrame(f *testing.F) {
	for _, seed := range []string{
		`{"call_id":"c1","event":"stream","values":{"loss":0.25}}`,
		`{"call_id":"c1","ok":true,"outputs":{"final":0.1}}`,
		"{\"line\":\"\xff\xfe\",\"event\":\"log\"}", "{\"k\xff\":1}", `{"a":"\u00e9"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		out, kind := protocol.Classify(line)
		if kind == protocol.LineGarbage {
			return
		}
		frame := textFrame(out)
		if !utf8.Valid(frame) || !json.Valid(frame) || frame[0] != '{' {
			t.Fatalf("textFrame(%q) = %q: not a UTF-8 JSON object", out, frame)
		}
	})
}
