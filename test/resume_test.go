package test

// The resume extension through the real binary: calls that survive an
// engine outage when the engine accepts it, and today's behaviour when it
// does not, or when the outage outlasts the grace.

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// streamValues is the "i" of each stream event, heartbeats and other events
// left out, in the order they came.
func streamValues(t *testing.T, events []enginetest.Message) []int {
	t.Helper()
	var out []int
	for _, m := range events {
		if m.Event != "stream" {
			continue
		}
		var v struct {
			Values struct {
				I *int `json:"i"`
			} `json:"values"`
		}
		if err := m.Decode(&v); err != nil || v.Values.I == nil {
			t.Fatalf("a stream event without values.i: %s", m.Raw)
		}
		out = append(out, *v.Values.I)
	}
	return out
}

// exactlyOnceInOrder fails unless got is 0, 1, ..., n-1.
func exactlyOnceInOrder(t *testing.T, got []int, n int) {
	t.Helper()
	for i, v := range got {
		if v != i {
			t.Fatalf("value %d is %d (of %d values): a value was lost, repeated or reordered (around it: %v)",
				i, v, len(got), got[max(0, i-3):min(len(got), i+4)])
		}
	}
	if len(got) != n {
		t.Fatalf("%d values arrived, want %d", len(got), n)
	}
}

// resumeEngine is a fake engine that accepts the extension with grace.
func resumeEngine(t *testing.T, grace time.Duration) *enginetest.Engine {
	return startEngine(t, enginetest.Options{Resume: grace})
}

// heldCallIDs is what the worker's resume message on wk says it holds.
func heldCallIDs(t *testing.T, wk *enginetest.Worker) []string {
	t.Helper()
	msg, err := wk.Resumed(timeoutCtx(t, 30*time.Second))
	if err != nil {
		t.Fatalf("no resume message after an accepting welcome: %v", err)
	}
	ids := []string{}
	for _, c := range msg.Calls {
		ids = append(ids, c.CallID)
	}
	return ids
}

// A generator call yielding every 100 ms runs through an engine outage and
// the engine gets every value exactly once, in order.
func TestCallSurvivesAShortOutage(t *testing.T) {
	t.Parallel()
	testOutage(t, 5*time.Second, 100)
}

func TestCallSurvivesATwoMinuteOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of two minutes")
	}
	t.Parallel()
	testOutage(t, 2*time.Minute, 1500)
}

func testOutage(t *testing.T, outage time.Duration, n int) {
	eng := resumeEngine(t, 10*time.Minute)
	w := startWorker(t, eng, nil)
	wk := attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 0 {
		t.Fatalf("a fresh worker says it holds %v", got)
	}
	c := run(t, wk, "gen", step{"announce": true}, step{"paced_events": n})
	runner := runnerPID(t, c)
	// The outage starts once the call is well under way.
	var before []enginetest.Message
	for len(before) < 20 {
		m, err := c.Next(timeoutCtx(t, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Event == "stream" {
			before = append(before, m)
		}
	}
	if err := eng.Restart(outage); err != nil {
		t.Fatal(err)
	}
	if !platform.ProcessAlive(runner) {
		t.Fatalf("the call's runner did not survive the outage of %s", outage)
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 1 || got[0] != "gen" {
		t.Fatalf("the worker says it holds %v, want [gen]", got)
	}
	answer, events, err := c.WaitTimeout(time.Duration(n)*100*time.Millisecond + time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !answer.OK {
		t.Fatalf("answer: %s", answer.Raw)
	}
	// The values read before the outage, then the rest.
	got := append(streamValues(t, before), streamValues(t, events)...)
	exactlyOnceInOrder(t, got, n)
	eventually(t, 10*time.Second, "the log to say the call was resumed", func() bool {
		return strings.Contains(w.logs.String(), "held call resumed")
	})
}

// An outage longer than the grace the engine allows stops the call as a
// lost connection always did: its processes go, nothing is sent.
func TestOutageLongerThanTheGraceStopsCalls(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, time.Second)
	state := t.TempDir()
	w := startWorker(t, eng, nil, "--state-dir", state, "--cancel-grace", "500ms")
	wk := attach(t, eng)
	c := run(t, wk, "long", step{"announce": true}, step{"grandchild": true}, step{"sleep_ms": 60000})
	runner, grandchild := pidsOf(t, c)
	done := make(chan error, 1)
	go func() { done <- eng.Restart(6 * time.Second) }()
	eventually(t, 5*time.Second, "the held call to be stopped at the end of its grace", func() bool {
		return !platform.ProcessAlive(runner) && !platform.ProcessAlive(grandchild)
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 0 {
		t.Fatalf("after the grace the worker still says it holds %v", got)
	}
	answer, _ := wait(t, run(t, wk, "next", step{"events": 1}))
	if !answer.OK {
		t.Fatalf("after the outage: %s", answer.Raw)
	}
	if m, err := c.Next(timeoutCtx(t, 10*time.Millisecond)); err == nil {
		t.Fatalf("the engine got a frame of the stopped call: %s", m.Raw)
	}
	if !strings.Contains(w.logs.String(), "outage-grace") {
		t.Errorf("the log does not say the grace ran out")
	}
}

// A restarted engine that lost its state claims nothing: held calls are
// stopped, nothing of them is sent.
func TestEngineThatClaimsNothingStopsHeldCalls(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, 10*time.Minute)
	startWorker(t, eng, nil, "--cancel-grace", "500ms")
	wk := attach(t, eng)
	c := run(t, wk, "lost", step{"announce": true}, step{"grandchild": true}, step{"sleep_ms": 60000})
	runner, grandchild := pidsOf(t, c)
	eng.Forget()
	if err := eng.Restart(time.Second); err != nil {
		t.Fatal(err)
	}
	if !platform.ProcessAlive(runner) {
		t.Fatal("the call was stopped before the engine said anything")
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 1 {
		t.Fatalf("the worker says it holds %v, want [lost]", got)
	}
	eventually(t, 10*time.Second, "the unclaimed call's processes to be stopped", func() bool {
		return !platform.ProcessAlive(runner) && !platform.ProcessAlive(grandchild)
	})
	answer, _ := wait(t, run(t, wk, "next", step{"events": 1}))
	if !answer.OK {
		t.Fatalf("after the restart: %s", answer.Raw)
	}
	if m, err := c.Next(timeoutCtx(t, 10*time.Millisecond)); err == nil {
		t.Fatalf("the engine got a frame of the unclaimed call: %s", m.Raw)
	}
}

// The engine answering cancel for a held call: it is stopped and answered
// as a cancel.
func TestEngineCancelsAHeldCall(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, 10*time.Minute)
	startWorker(t, eng, nil, "--cancel-grace", "500ms")
	wk := attach(t, eng)
	c := run(t, wk, "unwanted", step{"announce": true}, step{"events": 3}, step{"sleep_ms": 60000})
	runner := runnerPID(t, c)
	eng.CancelOnResume("unwanted")
	if err := eng.Restart(time.Second); err != nil {
		t.Fatal(err)
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 1 {
		t.Fatalf("the worker says it holds %v, want [unwanted]", got)
	}
	answer, _, err := c.WaitTimeout(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if answer.OK || answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Fatalf("answer: %s, want a NodeCancelled error", answer.Raw)
	}
	eventually(t, 10*time.Second, "the cancelled call's runner to be gone", func() bool { return !platform.ProcessAlive(runner) })
}

// A call that finishes while the engine is away keeps its answer, which
// the engine gets once after reconnecting, after the events it missed.
func TestCallFinishedDuringTheOutageIsAnsweredOnce(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, 10*time.Minute)
	startWorker(t, eng, nil)
	wk := attach(t, eng)
	c := run(t, wk, "quick", step{"announce": true}, step{"sleep_ms": 500}, step{"events": 5})
	runner := runnerPID(t, c)
	done := make(chan error, 1)
	go func() { done <- eng.Restart(4 * time.Second) }()
	eventually(t, 20*time.Second, "the call's runner to end during the outage", func() bool { return !platform.ProcessAlive(runner) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 1 {
		t.Fatalf("the worker says it holds %v, want [quick]", got)
	}
	answer, events, err := c.WaitTimeout(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !answer.OK {
		t.Fatalf("answer: %s", answer.Raw)
	}
	exactlyOnceInOrder(t, streamValues(t, events), 5)
	// A later call's answer comes after anything more the worker would
	// have sent of the first.
	if a, _ := wait(t, run(t, wk, "after", step{"events": 1})); !a.OK {
		t.Fatal(string(a.Raw))
	}
	if m, err := c.Next(timeoutCtx(t, 10*time.Millisecond)); err == nil {
		t.Fatalf("a frame after the answer: %s", m.Raw)
	}
}

// A call that floods output while the engine is away: the worker keeps a
// few MiB in memory, spills the rest to the state directory, loses
// nothing, and removes the spill file once it is replayed.
func TestFloodDuringTheOutageSpillsToDisk(t *testing.T) {
	t.Parallel()
	const n = 8000 // about 32 MiB of events
	eng := resumeEngine(t, 10*time.Minute)
	state := t.TempDir()
	w := startWorker(t, eng, nil, "--state-dir", state, "--listen", "127.0.0.1:0")
	addr := monitorAddr(t, w)
	wk := attach(t, eng)
	c := run(t, wk, "flood", step{"announce": true}, step{"sleep_ms": 1000}, step{"padded_events": n})
	runnerPID(t, c)
	held := filepath.Join(state, "held")
	restarted := make(chan error, 1)
	go func() { restarted <- eng.Restart(8 * time.Second) }()
	var st status.Status
	eventually(t, 30*time.Second, "the flood to be kept, most of it on disk", func() bool {
		var err error
		st, err = status.Read(state)
		return err == nil && st.Held != nil && st.Held.Disk > 24<<20
	})
	spills, _ := filepath.Glob(filepath.Join(held, "*.spill"))
	if len(spills) != 1 {
		t.Fatalf("spill files in %s: %v", held, spills)
	}
	pid := w.cmd.Process.Pid
	t.Logf("held through the outage: %d KiB in memory, %d KiB on disk; worker resident %.1f MiB (peak %.1f MiB)",
		st.Held.Memory>>10, st.Held.Disk>>10, memMiB(t, pid, "VmRSS"), memMiB(t, pid, "VmHWM"))
	if st.Held.Memory > 8<<20 {
		t.Errorf("%d bytes of held output in memory, over the 4 MiB kept plus 4 MiB retained", st.Held.Memory)
	}
	// The grace is the lesser of the engine's 10 minutes and the worker's
	// default --outage-grace of 5.
	if len(st.Held.Calls) != 1 || st.Held.Calls[0] != "flood" || st.Held.Deadline.Sub(st.Held.Since) != 5*time.Minute {
		t.Errorf("status says held %+v; want the call flood, to be stopped 5 minutes after it was held", st.Held)
	}
	eventually(t, 10*time.Second, "the metrics to show the held call and its spill", func() bool {
		m := scrape(t, addr)
		return m.value(t, "fluksio_worker_calls_held") == 1 && m.value(t, "fluksio_worker_held_output_bytes", "where", "disk") > 24<<20
	})
	if code, body := get(t, "GET", "http://"+addr+"/healthz"); !strings.Contains(body, "1 call(s) held") {
		t.Errorf("/healthz (HTTP %d) does not mention the held call: %s", code, body)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 1 {
		t.Fatalf("the worker says it holds %v, want [flood]", got)
	}
	answer, events, err := c.WaitTimeout(2 * time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !answer.OK {
		t.Fatalf("answer: %s", answer.Raw)
	}
	exactlyOnceInOrder(t, streamValues(t, events), n)
	eventually(t, 10*time.Second, "the spill file to be removed", func() bool {
		left, _ := filepath.Glob(filepath.Join(held, "*"))
		return len(left) == 0
	})
	eventually(t, 10*time.Second, "the metrics to count the call resumed", func() bool {
		m := scrape(t, addr)
		return m.value(t, "fluksio_worker_calls_held") == 0 && m.value(t, "fluksio_worker_held_calls_total", "result", "resumed") == 1
	})
}

// An engine that does not accept the extension (every engine today) sees
// nothing of it: no resume message, and calls stop with the connection.
func TestProtocol2EngineSeesNoResume(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	startWorker(t, eng, nil, "--cancel-grace", "500ms")
	wk := attach(t, eng)
	answer, _ := wait(t, run(t, wk, "plain", step{"events": 2}))
	if !answer.OK {
		t.Fatal(string(answer.Raw))
	}
	if m, err := wk.Stray(timeoutCtx(t, 10*time.Millisecond)); err == nil {
		t.Fatalf("a protocol-2 engine got a frame it did not ask for: %s", m.Raw)
	}
	var hello map[string]json.RawMessage
	if err := json.Unmarshal(wk.Hello.Raw, &hello); err != nil {
		t.Fatal(err)
	}
	for k := range hello {
		switch k {
		case "op", "protocol", "name", "labels", "python", "max_parallel", "venv_digest", "inventory":
		default:
			t.Errorf("the hello has a key protocol 2 does not: %q", k)
		}
	}
	c := run(t, wk, "dropped", step{"announce": true}, step{"sleep_ms": 60000})
	runner := runnerPID(t, c)
	if err := eng.Restart(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the call of the lost connection to be stopped", func() bool { return !platform.ProcessAlive(runner) })
}

// A reload asked while disconnected waits for the calls held through the
// outage, as it waits for running ones: the call completes after the
// engine is back, then the worker re-executes.
func TestReloadWhileDisconnectedWaitsForHeldCalls(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, 10*time.Minute)
	r := startReloadable(t, eng)
	wk := attach(t, eng)
	c := run(t, wk, "held", step{"announce": true}, step{"paced_events": 40})
	runner := runnerPID(t, c)
	restarted := make(chan error, 1)
	go func() { restarted <- eng.Restart(2 * time.Second) }()
	eventually(t, 10*time.Second, "the worker to notice the outage", func() bool {
		return strings.Contains(r.logs.String(), "connection lost; reconnecting")
	})
	r.signal(syscall.SIGHUP)
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	if !platform.ProcessAlive(runner) {
		t.Fatal("the reload stopped the held call")
	}
	wk = attach(t, eng)
	if got := heldCallIDs(t, wk); len(got) != 1 {
		t.Fatalf("the worker says it holds %v, want [held]", got)
	}
	answer, events, err := c.WaitTimeout(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !answer.OK {
		t.Fatalf("answer: %s", answer.Raw)
	}
	exactlyOnceInOrder(t, streamValues(t, events), 40)
	eventually(t, 20*time.Second, "the re-exec once the held call is done", func() bool {
		return strings.Contains(r.logs.String(), "executing the binary on disk")
	})
	logs := r.logs.String()
	if strings.Index(logs, "executing the binary on disk") < strings.Index(logs, "held call resumed") {
		t.Error("the worker re-executed before the held call was resumed")
	}
	attach(t, eng)
}

// A stop while disconnected stops held calls (nobody can hear them) and
// deletes what they kept; the worker exits 0 as it always did.
func TestStopWhileDisconnectedStopsHeldCalls(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, 10*time.Minute)
	state := t.TempDir()
	w := startWorker(t, eng, nil, "--state-dir", state, "--cancel-grace", "500ms")
	wk := attach(t, eng)
	c := run(t, wk, "held", step{"announce": true}, step{"sleep_ms": 500}, step{"padded_events": 2000}, step{"sleep_ms": 60000})
	runner := runnerPID(t, c)
	eng.Close()
	eventually(t, 30*time.Second, "the held call's output to spill", func() bool {
		st, err := status.Read(state)
		return err == nil && st.Held != nil && st.Held.Disk > 0
	})
	w.signal(syscall.SIGTERM)
	if code := w.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	if platform.ProcessAlive(runner) {
		t.Error("the held call's runner outlived the worker")
	}
	if left, _ := filepath.Glob(filepath.Join(state, "held", "*")); len(left) != 0 {
		t.Errorf("kept output left behind: %v", left)
	}
}

// The offer is a header on the upgrade, with --outage-grace in seconds;
// --outage-grace 0 sends none, and the worker then behaves as with a
// plain engine even where the engine would accept.
func TestOutageGraceZeroTurnsTheExtensionOff(t *testing.T) {
	t.Parallel()
	eng := resumeEngine(t, 10*time.Minute)
	startWorker(t, eng, nil, "--outage-grace", "90s")
	attach(t, eng)
	if got := eng.Attempts()[0].Header.Get("Fluksio-Resume"); got != "1; grace=90" {
		t.Errorf("the upgrade offers %q, want \"1; grace=90\"", got)
	}

	off := resumeEngine(t, 10*time.Minute)
	startWorker(t, off, nil, "--outage-grace", "0", "--cancel-grace", "500ms")
	wk := attach(t, off)
	if got := off.Attempts()[0].Header.Values("Fluksio-Resume"); len(got) != 0 {
		t.Errorf("with --outage-grace 0 the upgrade still offers %q", got)
	}
	c := run(t, wk, "plain", step{"announce": true}, step{"sleep_ms": 60000})
	runner := runnerPID(t, c)
	if m, err := wk.Stray(timeoutCtx(t, 10*time.Millisecond)); err == nil {
		t.Fatalf("a frame the engine did not ask for: %s", m.Raw)
	}
	if err := off.Restart(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the call of the lost connection to be stopped", func() bool { return !platform.ProcessAlive(runner) })
}
