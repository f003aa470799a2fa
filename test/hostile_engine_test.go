package test

import (
	"encoding/json"
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
	eng := startEngine(t, enginetest.Options{HelloAnswers: odd})
	w := startWorker(t, eng, nil, "--name", "box-9")
	wk := attach(t, eng)
	if wk.Hello.Name != "box-9" {
		t.Errorf("attached with hello %s", wk.Hello.Raw)
	}
	if n := len(eng.Hellos()); n != len(odd)+1 {
		t.Errorf("%d hellos, want %d: one per odd answer, then the welcome", n, len(odd)+1)
	}
	logs := w.logs.String()
	for _, want := range []string{"not a JSON object", "name that is not a string", "retrying"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log does not say %q:\n%s", want, logs)
		}
	}
	if answer, _ := wait(t, run(t, wk, "after")); !answer.OK {
		t.Errorf("after the retries: %s", answer.Raw)
	}
}

// --python /bin/true exits 0 without running anything: it is refused at
// start (exit 2), not accepted for every call to fail.
func TestPythonThatIsNotPythonIsRefused(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--python", "/bin/true")
	if code := w.wait(30 * time.Second); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if logs := w.logs.String(); !strings.Contains(logs, "does not behave as Python") || !strings.Contains(logs, "--python") {
		t.Errorf("the log does not say what is wrong and what to do:\n%s", logs)
	}
	if n := len(eng.Hellos()); n != 0 {
		t.Errorf("the worker attached %d times with no Python", n)
	}
}

// An engine that floods the worker with frames it ignores (garbage,
// unknown ops, cancels of unknown calls) gets a few log lines a second
// and a count of the rest, not a line each.
func TestEngineFloodsAreRateLimited(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil)
	wk := attach(t, eng)
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
		return strings.Contains(w.logs.String(), "were dropped")
	})
	logged := 0
	for _, line := range strings.Split(w.logs.String(), "\n") {
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
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil)
	wk := attach(t, eng)
	id := strings.Repeat("i", 1<<20)
	c := run(t, wk, id, step{"stderr": "node says hi"}, step{"events": 2})
	answer, events := wait(t, c)
	if !answer.OK || answer.CallID != id || len(events) != 2 {
		t.Fatalf("the long call answered %.200s with %d events", answer.Raw, len(events))
	}
	wk.Send(map[string]any{"op": "cancel", "call_id": id + "x"})
	wk.Send(map[string]any{"op": strings.Repeat("o", 1<<20)})
	wait(t, run(t, wk, "sync"))
	for _, line := range strings.Split(w.logs.String(), "\n") {
		if len(line) > 4096 {
			t.Fatalf("a log line of %d bytes: %.300s…", len(line), line)
		}
	}
	if !strings.Contains(w.logs.String(), "(1048576 bytes)") {
		t.Errorf("the log does not say how long the cut call_id was")
	}
}

// After an outsized frame from the engine, and after a call with an
// outsized request and answer, the worker gives the memory back. Its
// resident memory before, at the peak and after is logged.
func TestMemoryIsGivenBackAfterOutsizedMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a few hundred MiB")
	}
	eng := startEngine(t, enginetest.Options{})
	w := startProgram(t, releaseWorkerBin(t), []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
		"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
		"--state-dir", t.TempDir())
	wk := attach(t, eng)
	pid := w.cmd.Process.Pid
	wait(t, run(t, wk, "warm"))
	time.Sleep(300 * time.Millisecond)
	idle := procStatus(t, pid, "VmRSS")
	t.Logf("idle: %s", memLine(t, pid))
	// Given back means resident memory near idle again; the bound leaves
	// room for the collector's own bookkeeping, not for the message.
	const slackKB = 48 << 10
	settled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for procStatus(t, pid, "VmRSS") > idle+slackKB {
			if time.Now().After(deadline) {
				t.Fatalf("15 s after %s: %s; idle was %.1f MiB", what, memLine(t, pid), float64(idle)/1024)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("after %s: %s", what, memLine(t, pid))
	}

	frame := make([]byte, 100<<20)
	for i := range frame {
		frame[i] = 'x'
	}
	if err := wk.Send(frame); err != nil {
		t.Fatal(err)
	}
	frame = nil
	wait(t, run(t, wk, "sync"))
	settled("a 100 MiB frame that is not JSON")

	// The fake runner's answer carries the request it got: 100 MB each way.
	pad := strings.Repeat("p", 100_000_000)
	c, err := wk.Run(map[string]any{"call_id": "big", "pad": pad})
	if err != nil {
		t.Fatal(err)
	}
	pad = ""
	answer, _ := wait(t, c)
	var out struct {
		Outputs struct {
			Request json.RawMessage `json:"request"`
		} `json:"outputs"`
	}
	if err := answer.Decode(&out); err != nil || len(out.Outputs.Request) < 100_000_000 {
		t.Fatalf("the big call answered %d bytes: %v", len(answer.Raw), err)
	}
	settled("a call with a 100 MB request and answer")
}
