package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

// Fuzz tests of what the runner and the engine send the agent. Without
// -fuzz, `go test` runs the seeds below; CI runs each fuzzer for a while:
//
//	go test -run '^$' -fuzz FuzzLineReader -fuzztime 10s ./agent/

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

// pyTruthy is Python's bool() of a decoded JSON value, written apart from
// the agent's truthy so the two check each other.
func pyTruthy(raw json.RawMessage) bool {
	if raw == nil {
		return false // absent: .get("event") is None
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		panic("pyTruthy of invalid JSON " + string(raw))
	}
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	case json.Number:
		s := x.String()
		if !strings.ContainsAny(s, ".eE") {
			n, _ := new(big.Int).SetString(s, 10)
			return n.Sign() != 0
		}
		f, _ := strconv.ParseFloat(s, 64) // overflow gives ±Inf: true
		return f != 0
	}
	panic("unexpected JSON value")
}

// pythonKind is what the reference agent makes of a runner line: an
// object whose "event" (exact key, last duplicate wins) is truthy is an
// event, any other object the answer, anything else not protocol.
func pythonKind(line []byte) lineKind {
	var obj map[string]json.RawMessage
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &obj) != nil {
		return lineGarbage
	}
	if pyTruthy(obj["event"]) {
		return lineEvent
	}
	return lineAnswer
}

func FuzzClassify(f *testing.F) {
	for _, seed := range []string{
		`{"call_id":"c1","event":"stream","values":{"loss":0.25}}`,
		`{"call_id":"c1","event":"log","stream":"stdout","line":"epoch 1"}`,
		`{"call_id":"c1","ok":true,"outputs":{"final":0.1}}`,
		`{"call_id":"c1","ok":false,"error":{"type":"ValueError","message":"m","short":"s","traceback":"t"}}`,
		`{"call_id":"c1","event":"heartbeat"}`,
		`{}`, `{"event":null}`, `{"event":0}`, `{"event":-0.0}`, `{"event":1e-400}`, `{"event":1e400}`,
		`{"event":""}`, `{"event":"0"}`, `{"event":[]}`, `{"event":[ ]}`, `{"event":{}}`, `{"event":[0]}`,
		`{"event":false}`, `{"event":true}`, `{"event":"x","event":null}`, `{"event":null,"event":"x"}`,
		`{"Event":"log","ok":true}`, `{"EVENT":1}`, `{"ev\u0065nt":"log"}`, `{"event\u0000":"log"}`,
		`{"a":{"event":1},"b":"}","event":0}`, `{"a":"\"event\":1","event":""}`,
		`{"a":[{"event":1}],"event":{}}`, `{"x":"\\","event":"y"}`,
		` {"event":"log"} `, "{\"event\":\"log\"}\r", "\t{\"ok\":true}\n",
		`{"event":"log"`, `{"event":"log"}}`, `{"event":"log"} x`, `[{"event":"log"}]`, `"event"`,
		`null`, `true`, `42`, ``, `   `, `epoch 1 loss 0.3`, `{event:"log"}`, `{"event":NaN}`,
		"{\"line\":\"\xff\xfe\",\"event\":\"log\"}", "{\"k\xff\":1}", "\x1b[2K{\"ok\":true}",
		`{"event":"log","values":{"a":[1,2,{"b":null}]},"n":-1.5e-3}`,
		`{  "event"  :  "log"  ,  "x"  :  1  }`,
		"{\n\"event\"\n:\n1\n}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		out, kind := classify(line)
		if !bytes.Equal(out, bytes.TrimSpace(line)) {
			t.Fatalf("classify changed the line beyond trimming: %q -> %q", line, out)
		}
		if want := pythonKind(out); kind != want {
			t.Fatalf("classify(%q) = kind %d, want %d (0 garbage, 1 event, 2 answer)", line, kind, want)
		}
		if kind == lineGarbage {
			return
		}
		if len(out) == 0 || out[0] != '{' || !json.Valid(out) {
			t.Fatalf("classify(%q) = kind %d for a line that is not a JSON object", line, kind)
		}
		frame := textFrame(out)
		if !utf8.Valid(frame) || !json.Valid(frame) || frame[0] != '{' {
			t.Fatalf("textFrame(%q) = %q: not a UTF-8 JSON object", out, frame)
		}
	})
}

func FuzzEngineMessage(f *testing.F) {
	for _, seed := range []string{
		`{"op":"run","call_id":"c1","node":{"source":"def f(): pass\n","filename":"p.py"},"function":"f","inputs":{"steps":3},"settings":{}}`,
		`{"op":"run","call_id":"c1","env":{"CUDA_VISIBLE_DEVICES":"0","OMP_NUM_THREADS":4},"node":{"module":"pkg.mod"},"function":"f"}`,
		`{"op":"compile","call_id":"c2","node":{"source":"x = '<&>'\n","filename":"p.py"}}`,
		`{"op":"compile","call_id":7,"env":null}`,
		`{"op":"run","call_id":1.5e3}`,
		`{"op":"run","call_id":""}`,
		`{"op":"run"}`,
		`{"op":"cancel","call_id":"c1"}`,
		`{"op":"welcome","name":"x"}`,
		`{"op":5}`, `{"op":null,"call_id":null}`, `{}`, `null`, `[]`, `"run"`, `not json`, ``,
		`{"op":"run","call_id":"c1","env":{},"env":{"A":"1"}}`,
		`{"op":"run","call_id":"c1","Env":{"A":"1"},"ENV":1}`,
		`{"op":"run","call_id":"c1","op":"cancel"}`,
		`{"op":"run","call_id":"\u00e9\ud83d\ude00","k\u0065y":"v","big":123456789012345678901234567890,"f":1.50}`,
		"{\"op\":\"run\",\"call_id\":\"c\xff\",\"\xfe\":\"\xfd\"}",
		`{"op":"run","call_id":"c1","nested":{"env":{"keep":"me"}},"list":[{"env":1}]}`,
		`{"op":"run","call_id":{"id":"c1"}}`,
		`{"op":"run","call_id":"c1","s":"line\nbreak\u2028sep"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		callIDText(json.RawMessage(data)) // any bytes at all: must not panic
		m, err := parseMessage(data)
		if err != nil {
			return
		}
		if m.fields == nil {
			t.Fatal("parseMessage accepted a message with no fields")
		}
		if m.callID != callIDText(m.fields["call_id"]) {
			t.Fatalf("call_id %q is not callIDText of its field", m.callID)
		}
		if m.op != "run" && m.op != "compile" || m.callID == "" {
			return
		}

		want := map[string][]byte{}
		for k, v := range m.fields {
			if k == "env" {
				continue
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, v); err != nil {
				t.Fatalf("parseMessage kept an invalid value for %q: %v", k, err)
			}
			want[k] = compact.Bytes()
		}
		line, err := requestLine(m.fields)
		if err != nil {
			t.Fatalf("requestLine(%s): %v", data, err)
		}
		if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
			t.Fatalf("request %q is not exactly one line", line)
		}
		if !json.Valid(line) {
			t.Fatalf("request line is not JSON: %q", line)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(line, &got); err != nil {
			t.Fatalf("request line is not an object: %v", err)
		}
		if _, has := got["env"]; has {
			t.Fatalf("request line keeps env: %s", line)
		}
		if len(got) != len(want) {
			t.Fatalf("request has keys %q, want %q", sortedKeys(got), sortedKeys(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("request key %q = %s, want %s", k, got[k], v)
			}
		}
		if callIDText(got["call_id"]) != m.callID {
			t.Fatalf("call_id %q became %q", m.callID, callIDText(got["call_id"]))
		}
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
