package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// pythonStr must give what the reference agent's str(value) gives for the
// decoded JSON value, since that is what the runner's environment held.
// The expectations are Python 3's own output.
func TestPythonStr(t *testing.T) {
	tests := []struct{ raw, want string }{
		{`"x"`, "x"},
		{`""`, ""},
		{`"with \"quotes\" and \u00e9"`, `with "quotes" and é`},
		{`4`, "4"},
		{`-7`, "-7"},
		{`0`, "0"},
		{`true`, "True"},
		{`false`, "False"},
		{`null`, "None"},
		{`1.5`, "1.5"},
		{`0.1`, "0.1"},
		{`100.0`, "100.0"},
		{`1E2`, "100.0"},
		{`2.50`, "2.5"},
		{`0.0001`, "0.0001"},
		{`1e-05`, "1e-05"},
		{`1.5e-7`, "1.5e-07"},
		{`1e16`, "1e+16"},
		{`1e22`, "1e+22"},
		{`-0.0`, "-0.0"},
		// Python prints floats below 1e16 in full; Go's %g switches to an
		// exponent at 1e21 only with a precision, at 1e6 by default.
		{`1000000.0`, "1000000.0"},
		{`1234567.5`, "1234567.5"},
		{`1e15`, "1000000000000000.0"},
		// Python's ints have no size limit.
		{`18446744073709551616`, "18446744073709551616"},
	}
	for _, tt := range tests {
		if got := EnvText(json.RawMessage(tt.raw)); got != tt.want {
			t.Errorf("EnvText(%s) = %q, want %q (Python's str)", tt.raw, got, tt.want)
		}
	}
}

func TestParseMessage(t *testing.T) {
	tests := []struct {
		data       string
		ok         bool
		op, callID string
	}{
		{`{"op":"run","call_id":"c1"}`, true, "run", "c1"},
		{`{"op":"compile","call_id":7}`, true, "compile", "7"},
		{`{"op":"cancel","call_id":"c1"}`, true, "cancel", "c1"},
		{`{"op":"run","call_id":null}`, true, "run", ""},
		{`{"op":"run"}`, true, "run", ""},
		{`{"op":5,"call_id":"c1"}`, true, "", "c1"},
		{`{"op":"run","call_id":{"a":1}}`, true, "run", ""},
		{`{}`, true, "", ""},
		{`null`, false, "", ""},
		{`[]`, false, "", ""},
		{`"run"`, false, "", ""},
		{`not json`, false, "", ""},
		{``, false, "", ""},
	}
	for _, tt := range tests {
		m, err := ParseMessage([]byte(tt.data))
		if (err == nil) != tt.ok {
			t.Errorf("ParseMessage(%s) error = %v, want ok=%v", tt.data, err, tt.ok)
			continue
		}
		if m.Op != tt.op || m.CallID != tt.callID {
			t.Errorf("ParseMessage(%s) = op %q call_id %q, want %q %q", tt.data, m.Op, m.CallID, tt.op, tt.callID)
		}
	}
}

func TestRequestLineDropsOnlyEnv(t *testing.T) {
	data := `{"op":"run","call_id":"c1","env":{"CUDA_VISIBLE_DEVICES":"0"},` +
		`"node":{"source":"if a < b and c > d: print('&')\n","filename":"p.py"},` +
		`"function":"train","inputs":{"steps":3,"lr":1.50,"big":123456789012345678901234567890},"settings":{}}`
	m, err := ParseMessage([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	line, err := RequestLine(m.Fields)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("request line %q is not exactly one line", line)
	}
	if !json.Valid(line) {
		t.Fatalf("request line is not JSON: %s", line)
	}
	var got map[string]json.RawMessage
	json.Unmarshal(line, &got)
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{"call_id", "function", "inputs", "node", "op", "settings"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("request keys = %q, want %q (all but env)", keys, want)
	}
	// Source text travels as it is, without \u003c escapes, and numbers as
	// the engine wrote them.
	for _, want := range []string{`a < b and c > d: print('&')`, `"lr":1.50`, `123456789012345678901234567890`} {
		if !bytes.Contains(line, []byte(want)) {
			t.Errorf("request line lost %q: %s", want, line)
		}
	}
}

func TestParseWelcome(t *testing.T) {
	tests := []struct {
		answer  string
		name    string
		refusal string // "" when not a refusal
		failed  bool   // a failed attempt, to retry
	}{
		{`{"op":"welcome","name":"box"}`, "box", "", false},
		{`{"op":"welcome"}`, "", "", false},
		{`{"op":"welcome","name":null}`, "", "", false},
		{`{"op":"refused","reason":"pool full"}`, "", "pool full", false},
		{`{"op":"refused"}`, "", "refused", false},
		{`{"op":"error","reason":{"code":7}}`, "", `{"code":7}`, false},
		{`{"op":"welcome","name":5}`, "", "", true},
		{`{"op":"welcome","name":["a"]}`, "", "", true},
		{`[]`, "", "", true},
		{`null`, "", "", true},
		{`"welcome"`, "", "", true},
		{`<html>502</html>`, "", "", true},
		{`{}`, "", "", true},
		{`{"op":5}`, "", "", true},
		{`{"reason":"no op"}`, "", "", true},
	}
	for _, tt := range tests {
		name, err := ParseWelcome([]byte(tt.answer))
		var refused *RefusedError
		switch {
		case tt.refusal != "":
			if !errors.As(err, &refused) || refused.Reason != tt.refusal {
				t.Errorf("%s: got %q, %v; want a refusal %q", tt.answer, name, err, tt.refusal)
			}
		case tt.failed:
			if err == nil || errors.As(err, &refused) {
				t.Errorf("%s: got %q, %v; want a failed attempt (retried), not a refusal", tt.answer, name, err)
			}
		default:
			if err != nil || name != tt.name {
				t.Errorf("%s: got %q, %v; want welcome %q", tt.answer, name, err, tt.name)
			}
		}
	}
}

func TestTruthy(t *testing.T) {
	falsy := []string{"", "null", "false", "0", "-0", "0.0", "-0.0", "0e10", "0E-3", "1e-400", `""`, "[]", "[ ]", "{}", "{ \n }", " 0 ", " null "}
	truthful := []string{"true", "1", "-1", "0.5", "1e-300", "1e400", "-1e400", `"x"`, `"0"`, `"false"`, `" "`, `"\u0000"`, "[0]", "[[]]", `{"a":null}`, " true "}
	for _, v := range falsy {
		if truthy(json.RawMessage(v)) {
			t.Errorf("truthy(%s) = true; Python says false", v)
		}
	}
	for _, v := range truthful {
		if !truthy(json.RawMessage(v)) {
			t.Errorf("truthy(%s) = false; Python says true", v)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		line string
		kind LineKind
		out  string // the trimmed line classify returns
	}{
		{`{"call_id":"c1","event":"stream","values":{"loss":0.25}}`, LineEvent, ""},
		{`{"call_id":"c1","event":"heartbeat"}`, LineEvent, ""},
		{`{"call_id":"c1","ok":true,"outputs":{"final":0.1}}`, LineAnswer, ""},
		{`{"call_id":"c1","ok":false,"error":{"type":"ValueError"}}`, LineAnswer, ""},
		{`{}`, LineAnswer, ""},
		// Falsy events are answers, as in the reference's .get("event").
		{`{"call_id":"c1","event":null,"ok":true}`, LineAnswer, ""},
		{`{"call_id":"c1","event":"","ok":true}`, LineAnswer, ""},
		{`{"call_id":"c1","event":0,"ok":true}`, LineAnswer, ""},
		{`{"call_id":"c1","event":false,"ok":true}`, LineAnswer, ""},
		{`{"call_id":"c1","event":[],"ok":true}`, LineAnswer, ""},
		{`{"call_id":"c1","event":{},"ok":true}`, LineAnswer, ""},
		{`{"event":1}`, LineEvent, ""},
		{`{"event":{"kind":"x"}}`, LineEvent, ""},
		// The last of duplicate keys counts, as in Python's json.
		{`{"event":"log","event":null}`, LineAnswer, ""},
		{`{"event":null,"event":"log"}`, LineEvent, ""},
		// Surrounding blanks and a CR are trimmed.
		{"  {\"event\":\"log\"}\r", LineEvent, `{"event":"log"}`},
		{"\t{\"ok\":true}  ", LineAnswer, `{"ok":true}`},
		// Not JSON objects: never forwarded.
		{"", LineGarbage, ""},
		{"   ", LineGarbage, ""},
		{"epoch 1 loss 0.3", LineGarbage, ""},
		{`["event","log"]`, LineGarbage, ""},
		{`"event"`, LineGarbage, ""},
		{`null`, LineGarbage, ""},
		{`{"event":"log"`, LineGarbage, ""},
		{`{"event":"log"} trailing`, LineGarbage, ""},
		{`{"event":"log"}{"ok":true}`, LineGarbage, ""},
		{`{"event": NaN}`, LineGarbage, ""},
		{`{event: "log"}`, LineGarbage, ""},
		{"\x1b[2K{\"event\":\"log\"}", LineGarbage, ""},
	}
	for _, tt := range tests {
		out, kind := Classify([]byte(tt.line))
		if kind != tt.kind {
			t.Errorf("Classify(%q) kind = %d, want %d (0 garbage, 1 event, 2 answer)", tt.line, kind, tt.kind)
		}
		want := tt.out
		if want == "" {
			want = strings.TrimSpace(tt.line)
		}
		if string(out) != want {
			t.Errorf("Classify(%q) line = %q, want %q", tt.line, out, want)
		}
	}
}

// Only the exact key "event" marks progress: the reference reads it with
// dict.get("event"), which is case-sensitive. An answer that happens to
// carry an "Event" or "EVENT" field is still the answer.
func TestClassifyEventKeyIsCaseSensitive(t *testing.T) {
	tests := []struct {
		line string
		kind LineKind
	}{
		{`{"call_id":"c1","ok":true,"outputs":{},"Event":"done"}`, LineAnswer},
		{`{"call_id":"c1","ok":true,"EVENT":1}`, LineAnswer},
		{`{"call_id":"c1","event":null,"Event":"log"}`, LineAnswer},
		{`{"call_id":"c1","event":"log","EVENT":null}`, LineEvent},
	}
	for _, tt := range tests {
		if _, kind := Classify([]byte(tt.line)); kind != tt.kind {
			t.Errorf("Classify(%s) kind = %d, want %d (1 event, 2 answer)", tt.line, kind, tt.kind)
		}
	}
}
