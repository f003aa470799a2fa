package protocol

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzStampCallID: whatever object a runner writes, the stamped line is
// valid JSON whose only call_id is the call's, with every other member
// kept; a line already carrying exactly the call's id is not copied.
func FuzzStampCallID(f *testing.F) {
	for _, s := range []string{
		`{"call_id":"c1","ok":true}`,
		`{"call_id":"","ok":false,"error":{"type":"BadRequest"}}`,
		`{"event":"stream","values":{"call_id":"inner"}}`,
		`{"call_id":"other","event":"x","call_id":"c1"}`,
		`{ "call_id" : 5 , "a" : [1, {"b": "}"}] }`,
		`{"call\u005fid":"c1","ok":1}`,
		`{"call_id":"c1","call\u005fid":"c2","ok":1}`, // a second id under an escaped key
		`{}`,
		`{"call_id":"c1","values":{"call_id":"c2"}}`,
		`{"call_id":"c1","values":{"s":"\"call_id\""}}`,
		`{"call_id":"c1" , "x":1}`,
		`{"call_id":"c1"}`,
		`{"call_id":"c12","x":1}`,
	} {
		f.Add([]byte(s), "c1")
	}
	f.Fuzz(func(t *testing.T, line []byte, id string) {
		line, kind := Classify(line)
		if kind == LineGarbage {
			return
		}
		if !utf8.ValidString(id) {
			return // the worker's ids are decoded from JSON: valid UTF-8
		}
		got := StampCallID(line, EncodeCallID(id))
		if walked := stampMembers(line, EncodeCallID(id)); !bytes.Equal(got, walked) {
			t.Fatalf("stamped %s with %q: %s, by a walk of its members %s", line, id, got, walked)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(got, &members); err != nil {
			t.Fatalf("stamped %s into invalid JSON %s: %v", line, got, err)
		}
		var gotID string
		if json.Unmarshal(members["call_id"], &gotID) != nil || gotID != id {
			t.Fatalf("stamped %s with %q: %s", line, id, got)
		}
		if n := bytes.Count(got, []byte(`call_id`)) - bytes.Count(line, []byte(`call_id`)); n > 1 {
			t.Fatalf("stamped %s: %s adds %d call_ids", line, got, n)
		}
		var before map[string]json.RawMessage
		json.Unmarshal(line, &before)
		for k, v := range before {
			if k != "call_id" && !bytes.Equal(bytes.TrimSpace(members[k]), bytes.TrimSpace(v)) {
				t.Fatalf("stamped %s: member %q changed: %s", line, k, got)
			}
		}
	})
}

func TestStampCallIDKeepsAGoodLineAsItIs(t *testing.T) {
	line := []byte(`{"call_id":"c1","event":"stream","values":{"i":1}}`)
	id := EncodeCallID("c1")
	if got := StampCallID(line, id); &got[0] != &line[0] {
		t.Errorf("a line with the call's own id was copied")
	}
	if n := testing.AllocsPerRun(100, func() { StampCallID(line, id) }); n > 0 {
		t.Errorf("stamping a good line allocates %.0f times", n)
	}
}

func TestSalvageCall(t *testing.T) {
	deep := `{"op":"run","inputs":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `,"call_id":"d1"}`
	if op, id, ok := SalvageCall([]byte(deep)); !ok || op != "run" || id != "d1" {
		t.Errorf("SalvageCall(deep) = %q, %q, %v", op, id, ok)
	}
	for _, bad := range []string{`[1]`, `{"op":"run"}`, `{"call_id":"x"}`, `{"op":`, `not json`} {
		if _, _, ok := SalvageCall([]byte(bad)); ok {
			t.Errorf("SalvageCall(%q) found a call", bad)
		}
	}
}

// exactly is b in a slice of its own with no room past its end, so that
// reading past the end panics instead of reading whatever follows.
func exactly(b []byte) []byte {
	c := bytes.Clone(b)
	return c[:len(c):len(c)]
}

// FuzzSalvageCall: SalvageCall is given what the JSON decoder refused, so
// any bytes at all; it reads only within them, and what it salvages is
// what it salvages from the same bytes followed by blanks.
func FuzzSalvageCall(f *testing.F) {
	for _, s := range []string{
		`{"op":"run","call_id":"c1"}`,
		`{"op\}`,                      // a key cut in an escape
		`{"op":"run","call_id":"c\}`,  // a value cut in an escape
		`{"op":"run","call_id"}`,      // a key without a value
		`{"op" "run","call_id":"c1"}`, // no colon
		`{"op":"run",]:"call_id":"c1"}`,
		`{"op":"run","call_id":"c1",`,
		`{ }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		op, id, ok := SalvageCall(exactly(data))
		op2, id2, ok2 := SalvageCall(append(bytes.Clone(data), "   "...))
		if op != op2 || id != id2 || ok != ok2 {
			t.Fatalf("SalvageCall(%q) = %q, %q, %v; with blanks after it: %q, %q, %v", data, op, id, ok, op2, id2, ok2)
		}
	})
}

// BenchmarkStampCallID is the cost a relayed event pays for being checked
// to carry its call's id (a typical stream event, already right).
func BenchmarkStampCallID(b *testing.B) {
	line := []byte(`{"call_id": "c-0123456789", "event": "stream", "values": {"loss": 0.123456, "step": 1234, "lr": 0.0003}}`)
	id := EncodeCallID("c-0123456789")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		StampCallID(line, id)
	}
}
