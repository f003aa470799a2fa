package protocol

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// LineKind is what a line of a runner's stdout is.
type LineKind int

const (
	LineGarbage LineKind = iota // not a JSON object: logged here, never forwarded
	LineEvent                   // has a truthy "event": progress, forwarded
	LineAnswer                  // the first line without one: forwarded, ends the call
)

// Classify trims a runner line and says what it is. The protocol keys only
// on "event" being truthy (in Python's sense), so nothing else is decoded.
func Classify(line []byte) ([]byte, LineKind) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' || !validJSON(line) {
		return line, LineGarbage
	}
	if truthy(topLevelValue(line, "event")) {
		return line, LineEvent
	}
	return line, LineAnswer
}

// topLevelValue returns the raw value of key in a valid JSON object, nil
// when absent. Keys match exactly, and the last duplicate wins, as in
// Python's json.loads(line).get(key) (encoding/json would match "Event" and
// "EVENT" too).
func topLevelValue(obj []byte, key string) json.RawMessage {
	var found json.RawMessage
	forEachMember(obj, func(k, v []byte, _, _ int) {
		if keyEquals(k, key) {
			found = v
		}
	})
	return found
}

func keyEquals(rawKey []byte, key string) bool {
	if bytes.IndexByte(rawKey, '\\') < 0 {
		return len(rawKey) == len(key)+2 && string(rawKey[1:len(rawKey)-1]) == key
	}
	var decoded string
	return json.Unmarshal(rawKey, &decoded) == nil && decoded == key
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at i; b is valid
// JSON, so only strings and nesting need care. Given anything else, the end
// is at most len(b).
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return len(b) // unterminated, after an escape too
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r', ':':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// truthy is Python's truth value of a JSON value: null, false, 0, "", []
// and {} are false.
func truthy(raw json.RawMessage) bool {
	v := bytes.TrimSpace(raw)
	if len(v) == 0 {
		return false
	}
	switch v[0] {
	case 'n', 'f':
		return false
	case 't':
		return true
	case '"':
		return len(v) > 2
	case '[', '{':
		return len(bytes.TrimSpace(v[1:len(v)-1])) > 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return err != nil || f != 0
}

// Outcome is how an answer ended its call.
type Outcome int

const (
	Failed    Outcome = iota // "ok" is not truthy, the error is not a cancel
	Succeeded                // "ok" is truthy
	Cancelled                // an error of type NodeCancelled
)

// ReadOutcome reads how an answer line ended its call. Only top-level keys
// are scanned, as Classify does for events.
func ReadOutcome(answer []byte) Outcome {
	if truthy(topLevelValue(answer, "ok")) {
		return Succeeded
	}
	if e := topLevelValue(answer, "error"); len(e) > 0 && e[0] == '{' {
		if string(topLevelValue(e, "type")) == `"`+TypeNodeCancelled+`"` {
			return Cancelled
		}
	}
	return Failed
}

// ReadError reads a failed answer's error type and its short message (the
// full message when it has no short one), for the call's end record; both
// "" when the answer carries no error object.
func ReadError(answer []byte) (typ, short string) {
	e := topLevelValue(answer, "error")
	if len(e) == 0 || e[0] != '{' {
		return "", ""
	}
	text := func(key string) string {
		var s string
		json.Unmarshal(topLevelValue(e, key), &s)
		return s
	}
	typ, short = text("type"), text("short")
	if short == "" {
		short = text("message")
	}
	return typ, short
}
