package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// The error types of the answers the worker sends itself, and the message
// of an answer for a runner whose output ended without one.
const (
	TypeNodeCancelled = "NodeCancelled" // the worker stopped the call (cancel, stop, drain)
	TypeRemoteError   = "RemoteError"   // the call failed on this side: it died, or could not start
	MsgNodeStopped    = "the node process stopped"
)

// ErrorAnswer is a failed call's answer: ok false and what went wrong.
type ErrorAnswer struct {
	CallID string      `json:"call_id"`
	OK     bool        `json:"ok"`
	Error  ErrorDetail `json:"error"`
}

// ErrorDetail is an error answer's "error" object.
type ErrorDetail struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Short     string `json:"short"`
	Traceback string `json:"traceback"`
}

// NewErrorAnswer is the answer for a call that failed with message,
// which is also its short form; the worker has no traceback to give.
func NewErrorAnswer(callID, typ, message string) ErrorAnswer {
	return ErrorAnswer{CallID: callID, Error: ErrorDetail{Type: typ, Message: message, Short: message}}
}

// Heartbeat tells the engine a call is still running.
type Heartbeat struct {
	CallID string `json:"call_id"`
	Event  string `json:"event"`
}

// NewHeartbeat is the heartbeat of call callID.
func NewHeartbeat(callID string) Heartbeat { return Heartbeat{CallID: callID, Event: "heartbeat"} }

// RequestLine re-encodes a request without its env key, as one line: the
// keys sorted, each value compacted as it came (no HTML escaping), as
// encoding/json would write the map, but into one buffer sized up front,
// so a request of 100 MB costs 100 MB more, not several times that.
func RequestLine(fields map[string]json.RawMessage) ([]byte, error) {
	delete(fields, "env")
	keys := make([]string, 0, len(fields))
	size := 2
	for k, v := range fields {
		keys = append(keys, k)
		size += len(k) + len(v) + 8
	}
	sort.Strings(keys)
	buf := bytes.NewBuffer(make([]byte, 0, size))
	buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		writeKey(buf, k)
		buf.WriteByte(':')
		if err := json.Compact(buf, fields[k]); err != nil {
			return nil, fmt.Errorf("the request's %q: %w", k, err)
		}
	}
	buf.WriteString("}\n")
	return buf.Bytes(), nil
}

// writeKey writes k as a JSON string without HTML escaping, as the
// encoder with SetEscapeHTML(false) does.
func writeKey(buf *bytes.Buffer, k string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	enc.Encode(k)               // a string always encodes
	buf.Truncate(buf.Len() - 1) // Encode's newline
}

// EnvText renders a JSON value as Python's str() renders the decoded
// value, which is how the Python agent engines were written for turned env
// values into text, so a node sees the same strings here:
// strings as they are, True/False/None, integers exactly, floats in
// Python's repr.
func EnvText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "true":
		return "True"
	case "false":
		return "False"
	case "null":
		return "None"
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if !bytes.ContainsAny(raw, ".eE") {
		if n, ok := new(big.Int).SetString(string(raw), 10); ok {
			return n.String()
		}
	}
	if f, err := strconv.ParseFloat(string(raw), 64); err == nil {
		return pythonFloat(f)
	}
	return string(raw)
}

// pythonFloat is Python's repr of a float: the shortest digits that read
// back the same, fixed notation for exponents -4 to 15 (with ".0" on whole
// numbers), scientific beyond.
func pythonFloat(f float64) string {
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return sci
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
