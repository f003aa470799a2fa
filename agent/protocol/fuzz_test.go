package protocol

import (
	"bytes"
	"encoding/json"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// pythonKind is what the reference agent makes of a runner line: an
// object whose "event" (exact key, last duplicate wins) is truthy is an
// event, any other object the answer, anything else not protocol.
func pythonKind(line []byte) LineKind {
	var obj map[string]json.RawMessage
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &obj) != nil {
		return LineGarbage
	}
	if pyTruthy(obj["event"]) {
		return LineEvent
	}
	return LineAnswer
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
		out, kind := Classify(line)
		if !bytes.Equal(out, bytes.TrimSpace(line)) {
			t.Fatalf("classify changed the line beyond trimming: %q -> %q", line, out)
		}
		if want := pythonKind(out); kind != want {
			t.Fatalf("Classify(%q) = kind %d, want %d (0 garbage, 1 event, 2 answer)", line, kind, want)
		}
		if kind == LineGarbage {
			return
		}
		if len(out) == 0 || out[0] != '{' || !json.Valid(out) {
			t.Fatalf("Classify(%q) = kind %d for a line that is not a JSON object", line, kind)
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
		CallIDText(json.RawMessage(data)) // any bytes at all: must not panic
		m, err := ParseMessage(data)
		if err != nil {
			return
		}
		if m.Fields == nil {
			t.Fatal("parseMessage accepted a message with no fields")
		}
		if m.CallID != CallIDText(m.Fields["call_id"]) {
			t.Fatalf("call_id %q is not callIDText of its field", m.CallID)
		}
		if m.Op != "run" && m.Op != "compile" || m.CallID == "" {
			return
		}

		want := map[string][]byte{}
		for k, v := range m.Fields {
			if k == "env" {
				continue
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, v); err != nil {
				t.Fatalf("parseMessage kept an invalid value for %q: %v", k, err)
			}
			want[k] = compact.Bytes()
		}
		line, err := RequestLine(m.Fields)
		if err != nil {
			t.Fatalf("RequestLine(%s): %v", data, err)
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
		if CallIDText(got["call_id"]) != m.CallID {
			t.Fatalf("call_id %q became %q", m.CallID, CallIDText(got["call_id"]))
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

// FuzzValidJSON: validJSON says what json.Valid says, whatever the bytes.
func FuzzValidJSON(f *testing.F) {
	for _, seed := range []string{
		`{"call_id":"c1","event":"stream","values":{"loss":0.25}}`, `{}`, `[]`, `[ ]`, `{ }`, ``, ` `,
		`0`, `-0`, `01`, `-`, `1.`, `.5`, `1e`, `1e+`, `1E-7`, `-1.5e+30`, `1.0e5x`, `2.`, `-01`,
		`"a\u00e9\"\\\/\b\f\n\r\t"`, `"\u12"`, `"\u12g4"`, `"\x"`, "\"\x01\"", "\"\x7f\xff\"", `"abc`,
		`true`, `tru`, `false `, `nul`, `null null`, `[1,]`, `[,1]`, `{"a":1,}`, `{"a" 1}`, `{1:2}`,
		`{"a":[1,{"b":[true,false,null]}]}`, `[[[[[]]]]]`, "\t\r\n{}\n", `{}}`, `[1 2]`,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid %v", b, got, want)
		}
	})
}
