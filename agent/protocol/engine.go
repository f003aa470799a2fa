package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

// Version is the protocol version this worker speaks, sent in hello.
const Version = 2

// Operations the engine sends, and the op of the worker's first message.
const (
	OpHello   = "hello"
	OpWelcome = "welcome"
	OpRun     = "run"
	OpCompile = "compile"
	OpCancel  = "cancel"
)

// HeartbeatInterval: while a call runs, the engine hears from it at least
// this often, so it can tell working from wedged.
const HeartbeatInterval = 10 * time.Second

// Hello is the first message of every connection: who this worker is and
// what it holds.
type Hello struct {
	Op          string    `json:"op"`
	Protocol    int       `json:"protocol"`
	Name        string    `json:"name"`
	Labels      []string  `json:"labels"`
	Python      string    `json:"python"`
	MaxParallel int       `json:"max_parallel"`
	VenvDigest  string    `json:"venv_digest"`
	Inventory   Inventory `json:"inventory"`
}

// Inventory is what the worker's machine offers, as hello says it: the
// agent fills it from platform.DetectInventory (the same fields), so that
// this package knows the wire and not the machine.
type Inventory struct {
	CPUs  int  `json:"cpus"`
	GPUs  int  `json:"gpus"`
	RAMMB *int `json:"ram_mb"` // null: unknown
}

// ParseWelcome reads the engine's answer to hello: the name it gave this
// worker, a *RefusedError, or an error for an answer that makes no sense.
func ParseWelcome(data []byte) (string, error) {
	var answer map[string]json.RawMessage
	if err := json.Unmarshal(data, &answer); err != nil || answer == nil {
		return "", fmt.Errorf("the engine answered hello with something that is not a JSON object (%.200q); "+
			"is --url the engine's worker endpoint?", data)
	}
	var op string
	if err := json.Unmarshal(answer["op"], &op); err != nil || op == "" {
		return "", fmt.Errorf("the engine answered hello without an op (%.200q); is --url the engine's worker endpoint?", data)
	}
	if op != OpWelcome {
		reason := "refused"
		var text string
		var v any
		switch raw := answer["reason"]; {
		case json.Unmarshal(raw, &text) == nil && text != "":
			reason = text
		case raw != nil && json.Unmarshal(raw, &v) == nil && v != nil:
			reason = string(raw)
		}
		return "", &RefusedError{Reason: logging.Cut(reason, 500)}
	}
	var name string
	if raw, ok := answer["name"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &name); err != nil {
			return "", fmt.Errorf("the engine's welcome gave a name that is not a string (%.200s)", raw)
		}
	}
	return name, nil
}

// RefusedError is the engine saying no: a refusal answer to hello, or HTTP
// 401/403 on the handshake. Retrying would not change it, so the worker
// exits 1.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the engine refused this worker: " + e.Reason }

// Message is the part of an engine message the agent reads itself.
type Message struct {
	Fields map[string]json.RawMessage
	Op     string
	CallID string
}

// ParseMessage reads an engine message's op and call_id (as CallIDText
// makes it), keeping every field raw for the op's own parsing; an error
// says only that data is not a JSON object. An op or call_id of the wrong
// type reads as empty, for the caller to answer.
func ParseMessage(data []byte) (Message, error) {
	m := Message{}
	if err := json.Unmarshal(data, &m.Fields); err != nil || m.Fields == nil {
		return m, errors.New("not a JSON object")
	}
	if raw, ok := m.Fields["op"]; ok {
		json.Unmarshal(raw, &m.Op)
	}
	m.CallID = CallIDText(m.Fields["call_id"])
	return m, nil
}

// CallIDText is the call_id as text, as Python's str() makes it (engines
// written for the Python agent may send numbers): a string as it is, a
// number as written, null or absent as "".
func CallIDText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}
