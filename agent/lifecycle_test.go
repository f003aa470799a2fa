package agent_test

// A call's runner stopped, cancelled, dead or abandoned, as the engine
// hears it, in this process with the test binary as the runner.

import (
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

func TestCancelStopsTheWholeProcessGroup(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--cancel-grace", "1s")
	wk := f.wk
	// A runner that ignores SIGTERM and leaves a grandchild holding its
	// stdout: only SIGKILL of the whole group ends it.
	c := run(t, wk, "k1", step{"ignore_term": true}, step{"announce": true}, step{"grandchild": true}, step{"sleep_ms": 60000})
	runner, grandchild := pidsOf(t, c)
	start := time.Now()
	if err := wk.Cancel("k1"); err != nil {
		t.Fatal(err)
	}
	answer, _ := wait(t, c)
	if answer.OK || answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the node process stopped" {
		t.Fatalf("cancel answered %s", answer.Raw)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("cancel took %s", took)
	}
	eventually(t, goneTimeout, "runner and grandchild to be gone", func() bool { return !platform.ProcessAlive(runner) && !platform.ProcessAlive(grandchild) })
}

func TestCancelledRunnerMayAnswerItself(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	wk := f.wk
	c := run(t, wk, "k2", step{"on_term_answer": true}, step{"events": 1}, step{"sleep_ms": 60000})
	if _, err := c.Next(timeoutCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	wk.Cancel("k2")
	answer, _ := wait(t, c)
	if answer.Error == nil || answer.Error.Message != "runner saw SIGTERM" {
		t.Fatalf("want the runner's own answer, got %s", answer.Raw)
	}
}

// A runner's NodeCancelled is relayed only for a call the worker stopped:
// the runtime answers so to any SIGTERM, and one that nobody cancelled
// (numba raises one in a process that forks after using its OpenMP
// layer) is the node's failure.
func TestOnlyACancelIsAnsweredNodeCancelled(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	runtimeAnswer := `{"call_id":"k3","ok":false,"error":{"type":"NodeCancelled","message":"the call was cancelled","short":"NodeCancelled: the call was cancelled","traceback":""}}`
	answer, _ := wait(t, run(t, f.wk, "k3", step{"raw": runtimeAnswer}, step{"no_answer": true}))
	if answer.OK || answer.Error == nil || answer.Error.Type != "RemoteError" || !strings.Contains(answer.Error.Message, "a SIGTERM that the worker did not send") {
		t.Fatalf("an uncancelled call answered %s", answer.Raw)
	}
}

func TestRunnerDeathIsReported(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	wk := f.wk
	for _, tc := range []struct {
		id    string
		steps []step
		msg   string
	}{
		{"crash", []step{{"events": 2}, {"exit": 3}}, "the node process stopped: exited with code 3 without answering"},
		{"quiet-exit", []step{{"no_answer": true}}, "the node process stopped"},
	} {
		answer, events := wait(t, run(t, wk, tc.id, tc.steps...))
		e := answer.Error
		if answer.OK || e == nil || e.Type != "RemoteError" || e.Message != tc.msg || e.Short != e.Message || e.Traceback != "" {
			t.Errorf("%s answered %s", tc.id, answer.Raw)
		}
		if tc.id == "crash" && len(events) != 2 {
			t.Errorf("crash: events before the death were lost: %d", len(events))
		}
	}
	// A grandchild holding stdout after the runner died must not hang the call.
	c := run(t, wk, "orphan", step{"announce": true}, step{"grandchild": true}, step{"exit": 1})
	_, grandchild := pidsOf(t, c)
	answer, _ := wait(t, c)
	if answer.Error == nil || answer.Error.Type != "RemoteError" {
		t.Fatalf("orphan answered %s", answer.Raw)
	}
	eventually(t, goneTimeout, "the grandchild to be stopped", func() bool { return !platform.ProcessAlive(grandchild) })
}

func TestEngineRestartMidCall(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--cancel-grace", "1s")
	wk := f.wk
	// A quiet call: it writes nothing, so only the agent noticing the lost
	// connection can stop it.
	c := run(t, wk, "r1", step{"announce": true}, step{"grandchild": true}, step{"sleep_ms": 60000})
	runner, grandchild := pidsOf(t, c)
	if err := f.eng.Restart(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, goneTimeout, "the abandoned call's processes to be stopped", func() bool { return !platform.ProcessAlive(runner) && !platform.ProcessAlive(grandchild) })
	wk = f.attach(t)
	answer, _ := wait(t, run(t, wk, "r2", step{"events": 2}))
	if !answer.OK {
		t.Fatalf("after reconnecting: %s", answer.Raw)
	}
}

// pidsOf reads the runner's and its grandchild's pids from a call's events.
func pidsOf(t *testing.T, c *enginetest.Call) (runner, grandchild int) {
	t.Helper()
	for runner == 0 || grandchild == 0 {
		m, err := c.Next(timeoutCtx(t, callTimeout))
		if err != nil {
			t.Fatal(err)
		}
		var ev struct{ PID int }
		m.Decode(&ev)
		switch m.Event {
		case "started":
			runner = ev.PID
		case "grandchild":
			grandchild = ev.PID
		}
	}
	return runner, grandchild
}

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
