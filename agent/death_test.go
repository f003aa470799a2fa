package agent_test

import (
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// What the engine is told when a call's runner dies without answering:
// words an engine written for the reference agent matches on, and a cause
// only where one is known (nothing here says the OOM killer did it, so it
// is named as one possible cause only).
func TestWhyANodeDied(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "3")
	cases := []struct {
		id    string
		steps []map[string]any
		want  []string
	}{
		{"sigkill", []map[string]any{{"events": 1}, {"kill_self": true}}, []string{"the node process stopped: killed by SIGKILL that the worker did not send", "one possible cause"}},
		{"exit3", []map[string]any{{"exit": 3}}, []string{"the node process stopped: exited with code 3 without answering"}},
		{"exit0", []map[string]any{{"no_answer": true}}, []string{"the node process stopped"}},
	}
	calls := make([]*enginetest.Call, len(cases))
	for i, tc := range cases {
		calls[i] = f.run(t, tc.id, tc.steps...)
	}
	for i, tc := range cases {
		answer := answerOf(t, calls[i])
		e := answer.Error
		if answer.OK || e == nil || e.Type != "RemoteError" || e.Short != e.Message {
			t.Errorf("%s answered %s", tc.id, answer.Raw)
			continue
		}
		// Engines written for the reference agent match on its words.
		if !strings.HasPrefix(e.Message, "the node process stopped") {
			t.Errorf("%s: message %q does not begin with the reference's words", tc.id, e.Message)
		}
		if strings.Contains(e.Message, "from the kernel's out-of-memory killer") {
			t.Errorf("%s: message %q blames the OOM killer, which did nothing", tc.id, e.Message)
		}
		for _, want := range tc.want {
			if !strings.Contains(e.Message, want) {
				t.Errorf("%s: message %q does not say %q", tc.id, e.Message, want)
			}
		}
	}
}
