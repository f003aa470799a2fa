package agent_test

// What the worker makes of an engine that misbehaves: odd answers to
// hello, floods of frames it ignores, a call_id of a megabyte. In this
// process, the test binary as the runner.

import (
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// An answer to hello that is not an explicit refusal (garbage, a JSON
// array, a welcome whose name is not a string) is a failed attempt,
// retried with backoff, not a reason to stop for good.
func TestOddHelloAnswersAreRetried(t *testing.T) {
	t.Parallel()
	odd := []string{"<html>502 Bad Gateway</html>", "[]", `{"op":"welcome","name":5}`}
	f := serveFake(t, enginetest.Options{HelloAnswers: odd}, "--name", "box-9")
	wk := f.wk
	if wk.Hello.Name != "box-9" {
		t.Errorf("attached with hello %s", wk.Hello.Raw)
	}
	if n := len(f.eng.Hellos()); n != len(odd)+1 {
		t.Errorf("%d hellos, want %d: one per odd answer, then the welcome", n, len(odd)+1)
	}
	logs := f.log.String()
	for _, want := range []string{"not a JSON object", "name that is not a string", "retrying"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log does not say %q:\n%s", want, logs)
		}
	}
	if answer, _ := wait(t, run(t, wk, "after")); !answer.OK {
		t.Errorf("after the retries: %s", answer.Raw)
	}
}

// An engine that floods the worker with frames it ignores (garbage,
// unknown ops, cancels of unknown calls) gets a few log lines a second
// and a count of the rest, not a line each.
func TestEngineFloodsAreRateLimited(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	wk := f.wk
	const garbage, cancels, unknown = 20000, 5000, 5000
	if err := wk.Flood([]byte("not json"), garbage); err != nil {
		t.Fatal(err)
	}
	if err := wk.Flood([]byte(`{"op":"cancel","call_id":"nobody"}`), cancels); err != nil {
		t.Fatal(err)
	}
	if err := wk.Flood([]byte(`{"op":"dance"}`), unknown); err != nil {
		t.Fatal(err)
	}
	// Frames are handled in order: once this call is answered, the flood
	// has been read.
	if answer, _ := wait(t, run(t, wk, "after-flood")); !answer.OK {
		t.Fatalf("after the flood: %s", answer.Raw)
	}
	eventually(t, 5*time.Second, "the dropped count to be logged", func() bool {
		return strings.Contains(f.log.String(), "were dropped")
	})
	logged := 0
	for _, line := range strings.Split(f.log.String(), "\n") {
		if strings.Contains(line, "ignoring a message") || strings.Contains(line, "cancel for a call that is not running") {
			logged++
		}
	}
	if logged > 200 {
		t.Errorf("%d log lines for %d ignored frames; want a few a second", logged, garbage+cancels+unknown)
	}
	select {
	case <-wk.Done():
		t.Fatal("the flood took the connection down")
	default:
	}
}

// A call_id of 1 MB travels back to the engine whole but is logged cut.
func TestLongCallIDIsCutInLogs(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	wk := f.wk
	id := strings.Repeat("i", 1<<20)
	c := run(t, wk, id, step{"stderr": "node says hi"}, step{"events": 2})
	answer, events := wait(t, c)
	if !answer.OK || answer.CallID != id || len(events) != 2 {
		t.Fatalf("the long call answered %.200s with %d events", answer.Raw, len(events))
	}
	wk.Send(map[string]any{"op": "cancel", "call_id": id + "x"})
	wk.Send(map[string]any{"op": strings.Repeat("o", 1<<20)})
	wait(t, run(t, wk, "sync"))
	for _, line := range strings.Split(f.log.String(), "\n") {
		if len(line) > 4096 {
			t.Fatalf("a log line of %d bytes: %.300s…", len(line), line)
		}
	}
	if !strings.Contains(f.log.String(), "(1048576 bytes)") {
		t.Errorf("the log does not say how long the cut call_id was")
	}
}
