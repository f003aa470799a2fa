package agent_test

// What an operator reads in the log about each call: one record at its
// end with its outcome, parsed as a log pipeline parses --log-format json.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// callLogNodes are the nodes of the call-log test: one that fails, one
// that sleeps until it is stopped.
const callLogNodes = `
import time
from fluksio import Port, node

@node(requires=[Port("x", "int")], provides=[Port("y", "int")])
def fails(x):
    raise ValueError("x must be positive, got %d" % x)

@node(provides=[Port("started", "bool", stream=True), Port("done", "bool")])
def sleeps():
    yield {"started": True}
    time.sleep(600)
    return True
`

func callLogCall(id, function string, inputs map[string]any) map[string]any {
	return sourceCall(callLogNodes, "call_log_nodes.py", id, function, inputs)
}

// logRecords parses a JSON log, one record a line.
func logRecords(t *testing.T, text string) []map[string]any {
	t.Helper()
	var records []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("a log line that is not JSON: %q: %v", line, err)
		}
		records = append(records, r)
	}
	return records
}

// endRecords are the call end records in a JSON log, by call_id.
func endRecords(t *testing.T, text string) map[string]map[string]any {
	ends := map[string]map[string]any{}
	for _, r := range logRecords(t, text) {
		if msg, _ := r["msg"].(string); msg == "call ended" || strings.HasPrefix(msg, "call stopped") {
			id, _ := r["call_id"].(string)
			if _, dup := ends[id]; dup {
				t.Errorf("call %s has two end records: %v and %v", id, ends[id], r)
			}
			ends[id] = r
		}
	}
	return ends
}

func TestCallEndRecords(t *testing.T) {
	t.Parallel()
	s := startSession(t, "--log-format", "json")
	wantEnds := func(ids ...string) map[string]map[string]any {
		var ends map[string]map[string]any
		eventually(t, goneTimeout, fmt.Sprintf("end records of %s", ids), func() bool {
			ends = endRecords(t, s.log.String())
			for _, id := range ids {
				if ends[id] == nil {
					return false
				}
			}
			return true
		})
		return ends
	}

	ok, err := s.wk.Run(nodeCall("ok-1", "count", map[string]any{"n": 3}))
	if err != nil {
		t.Fatal(err)
	}
	failed, err := s.wk.Run(callLogCall("err-1", "fails", map[string]any{"x": -1}))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ok.WaitTimeout(callTimeout); err != nil {
		t.Fatal(err)
	}
	if _, _, err := failed.WaitTimeout(callTimeout); err != nil {
		t.Fatal(err)
	}
	cancelled, err := s.wk.Run(callLogCall("cancel-1", "sleeps", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitStream(t, cancelled)
	if err := s.wk.Cancel("cancel-1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cancelled.WaitTimeout(callTimeout); err != nil {
		t.Fatal(err)
	}
	ends := wantEnds("ok-1", "err-1", "cancel-1")

	check := func(id, level, function, outcome, errType, errHas string) {
		t.Helper()
		r := ends[id]
		if r["level"] != level || r["function"] != function || r["outcome"] != outcome || r["op"] != "run" {
			t.Errorf("%s: end record %v; want level %s, function %s, outcome %s, op run", id, r, level, function, outcome)
		}
		// Whole milliseconds: a number without a fraction, as dashboards
		// expect of an integer field.
		for _, k := range []string{"duration_ms", "cpu_ms", "peak_rss_mb"} {
			n, isNum := r[k].(float64)
			if !isNum || n != float64(int64(n)) || n < 0 {
				t.Errorf("%s: %s is %v; want a whole number", id, k, r[k])
			}
		}
		if errType == "" {
			if _, has := r["error"]; has {
				t.Errorf("%s: a successful call's end record has an error: %v", id, r)
			}
			return
		}
		if r["error_type"] != errType || !strings.Contains(fmt.Sprint(r["error"]), errHas) {
			t.Errorf("%s: error_type %v, error %q; want %s, saying %q", id, r["error_type"], r["error"], errType, errHas)
		}
	}
	check("ok-1", "INFO", "count", "ok", "", "")
	check("err-1", "WARN", "fails", "error", "ValueError", "x must be positive, got -1")
	check("cancel-1", "INFO", "sleeps", "cancelled", "NodeCancelled", "")
	if ms, _ := ends["cancel-1"]["duration_ms"].(float64); ms < 1 {
		t.Errorf("the cancelled call ran %v ms; want the time it ran", ms)
	}

	// A lost connection: the call is stopped, and its record says so.
	lost, err := s.wk.Run(callLogCall("lost-1", "sleeps", nil))
	if err != nil {
		t.Fatal(err)
	}
	waitStream(t, lost)
	s.wk.Drop()
	ends = wantEnds("lost-1")
	r := ends["lost-1"]
	if r["level"] != "WARN" || r["outcome"] != "cancelled" || r["function"] != "sleeps" ||
		!strings.Contains(fmt.Sprint(r["msg"]), "the connection to the engine was lost; the engine reschedules it") {
		t.Errorf("the call stopped with the connection: %v; want a WARN naming sleeps, cancelled, saying the connection was lost", r)
	}
}

// waitStream waits for a call's first stream event: its node runs.
func waitStream(t *testing.T, c *enginetest.Call) {
	t.Helper()
	nextEvent(t, c, "stream")
}

// --node-log-level quiets what nodes print on stderr without hiding the
// worker's own records of its calls.
func TestNodeLogLevel(t *testing.T) {
	t.Parallel()
	const node = "import sys\ndef talk():\n    sys.stderr.write('node-said-this\\n')\n    sys.stderr.flush()\n    return {}\n"
	call := sourceCall(node, "talk.py", "talk-1", "talk", map[string]any{})
	for _, tt := range []struct {
		level string
		shown bool
	}{{"info", true}, {"debug", false}, {"off", false}} {
		t.Run(tt.level, func(t *testing.T) {
			t.Parallel()
			s := startSession(t, "--log-format", "json", "--log-level", "info", "--node-log-level", tt.level)
			c, err := s.wk.Run(call)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.WaitTimeout(callTimeout); err != nil {
				t.Fatal(err)
			}
			eventually(t, goneTimeout, "the call's end record", func() bool { return endRecords(t, s.log.String())["talk-1"] != nil })
			if shown := strings.Contains(s.log.String(), "node-said-this"); shown != tt.shown {
				t.Errorf("--node-log-level %s at --log-level info: the node's stderr line logged: %v, want %v", tt.level, shown, tt.shown)
			}
		})
	}
}

// --log-level debug says where the time before attaching went.
func TestAttachTimingsAtDebug(t *testing.T) {
	t.Parallel()
	s := startSession(t, "--log-format", "json")
	var hello, welcomed map[string]any
	eventually(t, goneTimeout, "the welcome's debug record", func() bool {
		for _, r := range logRecords(t, s.log.String()) {
			switch r["msg"] {
			case "hello ready; dialing":
				hello = r
			case "welcomed":
				welcomed = r
			}
		}
		return welcomed != nil
	})
	if hello == nil || hello["level"] != "DEBUG" || hello["hello_ms"] == nil || !strings.Contains(fmt.Sprint(hello["note"]), "pip freeze") {
		t.Errorf("the hello's debug record: %v; want hello_ms and a note that it is mostly pip freeze", hello)
	}
	if _, ok := welcomed["dial_hello_welcome_ms"].(float64); !ok {
		t.Errorf("the welcome's debug record: %v; want dial_hello_welcome_ms", welcomed)
	}
}

// What a node prints is logged as the node's output, with its call and
// stream, never as something the worker says about stderr.
func TestNodePrintIsLoggedAsNodeOutput(t *testing.T) {
	t.Parallel()
	const node = "def talk():\n    print('node-printed-this', flush=True)\n    return {}\n"
	s := startSession(t, "--log-format", "json")
	c, err := s.wk.Run(sourceCall(node, "talk.py", "print-1", "talk", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.WaitTimeout(callTimeout); err != nil {
		t.Fatal(err)
	}
	eventually(t, goneTimeout, "the call's end record", func() bool { return endRecords(t, s.log.String())["print-1"] != nil })
	found := false
	for _, r := range logRecords(t, s.log.String()) {
		if line, _ := r["line"].(string); strings.Contains(line, "node-printed-this") {
			found = true
			if r["msg"] != "node output" || r["call_id"] != "print-1" || r["stream"] != "stdout" {
				t.Errorf("a node's print() logged as %v; want msg \"node output\", its call_id and stream stdout", r)
			}
		}
	}
	if !found {
		t.Errorf("the node's print() was not logged:\n%s", s.log.String())
	}
}
