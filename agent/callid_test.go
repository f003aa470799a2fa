package agent_test

// Every run gets exactly one answer, under its own call_id, and nothing
// else under that id: whatever the request holds, whatever the node writes.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// noStray fails the test if the worker sent a frame of no known call.
func noStray(t *testing.T, wk *enginetest.Worker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if m, err := wk.Stray(ctx); err == nil {
		t.Errorf("the worker sent a frame of no call the engine knows: %s", m.Raw)
	}
}

// Requests that Go's decoder takes and Python's json refuses (nesting
// past Python's recursion limit, an integer of more than 4300 digits,
// invalid UTF-8 in a text frame), and one nested past Go's own limit, are
// each answered once, under their own call_id.
func TestUnreadableRequestsAreAnsweredUnderTheirOwnID(t *testing.T) {
	t.Parallel()
	wk := startSession(t).wk
	node := `{"source":"def f(**kw):\n    return {}\n","filename":"pipeline.py"}`
	request := func(id, inputs string) string {
		return `{"op":"run","call_id":"` + id + `","node":` + node + `,"function":"f","settings":{},"inputs":` + inputs + `}`
	}
	nested := func(depth int) string { return `{"x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}` }
	for _, tc := range []struct{ id, frame string }{
		{"deep-python", request("deep-python", nested(5000))},
		{"huge-int", request("huge-int", `{"n":`+strings.Repeat("7", 5000)+`}`)},
		{"bad-utf8", request("bad-utf8", `{"s":"caf`+"\xe9"+`"}`)},
		{"deep-go", request("deep-go", nested(20000))},
	} {
		c := wk.Expect(tc.id)
		if err := wk.Send(tc.frame); err != nil {
			t.Fatal(err)
		}
		answer, _ := wait(t, c)
		if answer.CallID != tc.id {
			t.Errorf("%s answered under %q: %s", tc.id, answer.CallID, answer.Raw)
		}
	}
	noStray(t, wk)
}

// A node cannot speak for another call: whatever call_id its lines carry,
// they are its own call's.
func TestANodeCannotSpeakForAnotherCall(t *testing.T) {
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}, "--parallel", "2").wk
	victim := run(t, wk, "victim", step{"announce": true}, step{"sleep_ms": 60000})
	started(t, victim)
	attacker := run(t, wk, "attacker",
		step{"raw": `{"call_id":"victim","event":"stream","values":{"spoofed":true}}`},
		step{"raw": `{"event":"stream","values":{"no_id":true}}`},
		step{"raw": `{"call_id":"victim","ok":true,"outputs":{"spoofed":true}}`})
	answer, events := wait(t, attacker)
	if !strings.Contains(string(answer.Raw), `"spoofed":true`) {
		t.Errorf("the attacker's own answer is %s; want the line it wrote, as its own", answer.Raw)
	}
	if len(events) != 2 {
		t.Errorf("the attacker's call got %d events; want its 2", len(events))
	}
	for _, m := range append(events, answer) {
		if m.CallID != "attacker" {
			t.Errorf("a line of the attacker's call went out under %q: %s", m.CallID, m.Raw)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if m, err := victim.Next(ctx); err == nil {
		t.Errorf("the victim's call got a frame the attacker wrote: %s", m.Raw)
	}
	wk.Cancel(victim.ID)
	if answer, _ := wait(t, victim); answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Errorf("the victim's call, cancelled, answered %s", answer.Raw)
	}
	noStray(t, wk)
}
