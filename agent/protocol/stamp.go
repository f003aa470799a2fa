package protocol

import (
	"bytes"
	"encoding/json"
)

// StampCallID makes a runner line (an event or the answer, a valid JSON
// object) carry its call's id and no other: every top-level "call_id" is
// replaced by one, first, with id. A runner's line belongs to the call the
// runner was started for, whatever it says: node code of one call cannot
// speak for another, and a runtime that could not read its request (and so
// answers with "call_id": "") still answers its own call. A line that
// already carries exactly id, as every line of a well-behaved runner does,
// is returned as it is, without a copy. want is the id as JSON
// (EncodeCallID).
func StampCallID(line []byte, want json.RawMessage) []byte {
	if leadsWithOnly(line, want) {
		return line
	}
	return stampMembers(line, want)
}

// stampMembers is StampCallID by a walk of line's members.
func stampMembers(line []byte, want json.RawMessage) []byte {
	found, other := 0, false
	forEachMember(line, func(key, value []byte, _, _ int) {
		if keyEquals(key, "call_id") {
			found++
			other = other || !bytes.Equal(value, want)
		}
	})
	if found == 1 && !other {
		return line
	}
	out := make([]byte, 0, len(line)+len(want)+12)
	out = append(out, `{"call_id":`...)
	out = append(out, want...)
	forEachMember(line, func(key, _ []byte, start, end int) {
		if !keyEquals(key, "call_id") {
			out = append(out, ',')
			out = append(out, line[start:end]...)
		}
	})
	return append(out, '}')
}

// leadsWithOnly says that obj's first member is "call_id" with the value
// want and that nothing after it could be another "call_id": neither the
// key's text nor a backslash (a key may spell it with escapes) is there.
// A runtime writes every line so: the members need no walk.
func leadsWithOnly(obj []byte, want json.RawMessage) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if !bytes.HasPrefix(obj[i:], []byte(`"call_id"`)) {
		return false
	}
	i = skipSpace(obj, i+len(`"call_id"`))
	if i >= len(obj) || obj[i] != ':' {
		return false
	}
	i = skipSpace(obj, i+1)
	if !bytes.HasPrefix(obj[i:], want) {
		return false
	}
	rest := obj[i+len(want):]
	if j := skipSpace(rest, 0); j >= len(rest) || rest[j] != ',' && rest[j] != '}' {
		return false // want is a prefix of a longer value
	}
	return bytes.IndexByte(rest, '\\') < 0 && !bytes.Contains(rest, []byte(`"call_id"`))
}

// EncodeCallID is a call's id as StampCallID writes it: a JSON string.
func EncodeCallID(id string) json.RawMessage {
	b, _ := json.Marshal(id) // a string always encodes
	return b
}

// forEachMember calls fn with each top-level member of a valid JSON
// object: its raw key and value, and where the member starts and ends.
// Given anything else (SalvageCall's input), it stops where the shape
// breaks and never reads past the end of obj.
func forEachMember(obj []byte, fn func(key, value []byte, start, end int)) {
	i := skipSpace(obj, 0) + 1 // past '{'
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return
		}
		start := i
		keyEnd := skipValue(obj, i)
		i = skipSpace(obj, keyEnd)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipSpace(obj, i+1)
		valueEnd := skipValue(obj, i)
		fn(obj[start:keyEnd], obj[i:valueEnd], start, valueEnd)
		i = skipSpace(obj, valueEnd)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// SalvageCall finds the op and call_id of an engine message that
// ParseMessage refused as a whole although it is shaped as an object:
// one nested deeper than the JSON decoder follows (10,000 levels), say.
// It looks at top-level members only and reports ok when both are
// there, so such a request can still be answered under its own id.
func SalvageCall(data []byte) (op, callID string, ok bool) {
	data = bytes.TrimSpace(data)
	if len(data) < 2 || data[0] != '{' || data[len(data)-1] != '}' {
		return "", "", false
	}
	var rawOp, rawID []byte
	forEachMember(data, func(key, value []byte, _, _ int) {
		switch {
		case keyEquals(key, "op"):
			rawOp = value
		case keyEquals(key, "call_id"):
			rawID = value
		}
	})
	if json.Unmarshal(rawOp, &op) != nil {
		return "", "", false
	}
	callID = CallIDText(rawID)
	return op, callID, callID != ""
}
