package test

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// At most --parallel runner processes exist at once, however many calls
// the engine sends; the rest wait and then run.
func TestParallelIsEnforced(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "2")
	wk := attach(t, eng)
	var most atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if n := int64(len(childrenOf(w.cmd.Process.Pid))); n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	var calls []*enginetest.Call
	for i := 0; i < 6; i++ {
		calls = append(calls, run(t, wk, fmt.Sprintf("p%d", i), step{"announce": true}, step{"sleep_ms": 600}))
	}
	for _, c := range calls {
		if answer, _ := wait(t, c); !answer.OK {
			t.Errorf("%s answered %s", c.ID, answer.Raw)
		}
	}
	close(stop)
	<-watched
	if n := most.Load(); n > 2 || n == 0 {
		t.Errorf("%d runner processes at once, want at most --parallel 2", n)
	}
}

// startedEvent reads a call's frames up to its "started" event and fails
// if the answer comes first.
func startedEvent(t *testing.T, c *enginetest.Call) {
	t.Helper()
	for {
		m, err := c.Next(timeoutCtx(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Event == "started" {
			return
		}
		if m.IsAnswer() {
			t.Fatalf("%s answered %s before it started", c.ID, m.Raw)
		}
	}
}

// startedIn reports whether any of events says the runner started.
func startedIn(events []enginetest.Message) bool {
	for _, m := range events {
		if m.Event == "started" {
			return true
		}
	}
	return false
}

// Calls beyond --parallel wait in arrival order; while they wait they get
// heartbeats, a duplicate of one is refused, and a cancel of one is
// answered NodeCancelled without starting anything.
func TestWaitingCallsRunInOrderWithHeartbeats(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "1")
	wk := attach(t, eng)
	first := run(t, wk, "w0", step{"announce": true}, step{"sleep_ms": 11000})
	startedEvent(t, first)
	b := run(t, wk, "w1", step{"announce": true})
	cancelled := run(t, wk, "w2", step{"announce": true})
	d := run(t, wk, "w3", step{"announce": true})

	// A duplicate of a waiting call is refused; the waiting one is kept.
	if err := wk.Send(map[string]any{"op": "run", "call_id": "w1", "steps": []step{}}); err != nil {
		t.Fatal(err)
	}
	m, err := b.Next(timeoutCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if m.OK || m.Error == nil || !strings.Contains(m.Error.Message, "already waiting") {
		t.Fatalf("the duplicate of a waiting call was answered %s", m.Raw)
	}

	// A cancel of a waiting call is answered at once, and it never starts.
	if err := wk.Cancel("w2"); err != nil {
		t.Fatal(err)
	}
	answer, events := wait(t, cancelled)
	if answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the call was cancelled before it started" || startedIn(events) {
		t.Errorf("a cancelled waiting call answered %s after %q", answer.Raw, rawOf(events))
	}

	// w1 waits behind w0 (11 s) and hears a heartbeat while it waits.
	m, err = b.Next(timeoutCtx(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if m.Event != "heartbeat" || string(m.Raw) != `{"call_id":"w1","event":"heartbeat"}` {
		t.Fatalf("w1's first frame while waiting was %s, want a heartbeat", m.Raw)
	}
	answer, events = wait(t, first)
	if !answer.OK || len(events) != 1 || events[0].Event != "heartbeat" {
		t.Errorf("w0 answered %s after %q", answer.Raw, rawOf(events))
	}
	// Then w1 and w3 run, in arrival order: w1 answers before w3 starts.
	answer, events = wait(t, b)
	if !answer.OK || !startedIn(events) {
		t.Errorf("w1 answered %s after %q", answer.Raw, rawOf(events))
	}
	answer, events = wait(t, d)
	if !answer.OK || !startedIn(events) {
		t.Errorf("w3 answered %s after %q", answer.Raw, rawOf(events))
	}
	logs := w.logs.String()
	const started = `msg="call started after waiting for a slot" call_id=`
	if i, j := strings.Index(logs, started+"w1 "), strings.Index(logs, started+"w3 "); i < 0 || j < i {
		t.Errorf("w1 and w3 did not start in arrival order after waiting (at %d and %d in the log)", i, j)
	}
}

// SIGTERM answers the waiting calls NodeCancelled, "the worker is
// stopping", without starting them.
func TestStopAnswersWaitingCallsWithoutStartingThem(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "1", "--cancel-grace", "1s")
	wk := attach(t, eng)
	running := run(t, wk, "s0", step{"announce": true}, step{"sleep_ms": 60000})
	startedEvent(t, running)
	waiting := []*enginetest.Call{run(t, wk, "s1", step{"announce": true}), run(t, wk, "s2", step{"announce": true})}
	time.Sleep(300 * time.Millisecond)
	w.signal(syscall.SIGTERM)
	for _, c := range append(waiting, running) {
		answer, events := wait(t, c)
		if answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the worker is stopping" {
			t.Errorf("%s answered %s", c.ID, answer.Raw)
		}
		if c != running && startedIn(events) {
			t.Errorf("%s was started after the stop: %q", c.ID, rawOf(events))
		}
	}
	if code := w.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
}

// SIGQUIT declines new calls, but calls already waiting were accepted:
// they run, in turn, before the worker exits.
func TestDrainRunsWaitingCalls(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "1")
	wk := attach(t, eng)
	first := run(t, wk, "q0", step{"announce": true}, step{"sleep_ms": 1500})
	startedEvent(t, first)
	second := run(t, wk, "q1", step{"announce": true})
	time.Sleep(300 * time.Millisecond)
	w.signal(syscall.SIGQUIT)
	time.Sleep(300 * time.Millisecond)
	late := run(t, wk, "q2")
	answer, _ := wait(t, late)
	if answer.Error == nil || answer.Error.Message != "the worker is draining" {
		t.Errorf("a call during the drain answered %s", answer.Raw)
	}
	answer, _ = wait(t, first)
	if !answer.OK {
		t.Errorf("q0 answered %s", answer.Raw)
	}
	// q1 starts only once q0's slot is free.
	m, err := second.Next(timeoutCtx(t, 20*time.Second))
	if err != nil || m.Event != "started" {
		t.Fatalf("q1's first frame after q0's answer: %s %v", m.Raw, err)
	}
	if answer, _ = wait(t, second); !answer.OK {
		t.Errorf("q1 answered %s", answer.Raw)
	}
	if code := w.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
}

// procStatus reads numbers (kB, or a count) from /proc/PID/status.
func procStatus(t testing.TB, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			n, _ := strconv.Atoi(strings.Fields(line)[1])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func memLine(t testing.TB, pid int) string {
	return fmt.Sprintf("threads %d, VmRSS %.1f MiB, VmHWM %.1f MiB", procStatus(t, pid, "Threads"),
		float64(procStatus(t, pid, "VmRSS"))/1024, float64(procStatus(t, pid, "VmHWM"))/1024)
}

// 10,000 calls sent at once at --parallel 1: one runner process, 10,000
// calls waiting (the bound), each heard from every 10 s, and the calls
// beyond the bound answered at once with an error that names it. Then a
// stop answers every waiting call without starting one. The worker's
// threads and memory are logged (never asserted as timings); run with -v
// to see them.
func TestTenThousandCallsAtParallelOne(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 10,010 calls and waits out a heartbeat")
	}
	eng := startEngine(t, enginetest.Options{})
	state := t.TempDir()
	w := startProgram(t, releaseWorkerBin(t), []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
		"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
		"--state-dir", state, "--parallel", "1", "--cancel-grace", "1s")
	wk := attach(t, eng)
	pid := w.cmd.Process.Pid
	tally := wk.StartTally()
	time.Sleep(500 * time.Millisecond)
	t.Logf("attached, idle: %s", memLine(t, pid))

	const waiting, beyond = 10000, 9
	total := 1 + waiting + beyond
	sent := time.Now()
	for i := 0; i < total; i++ {
		steps := []step{{"announce": true}}
		if i == 0 {
			steps = append(steps, step{"sleep_ms": 60000})
		}
		b, _ := json.Marshal(map[string]any{"op": "run", "call_id": fmt.Sprintf("t%05d", i), "steps": steps})
		if err := wk.Send(b); err != nil {
			t.Fatal(err)
		}
	}
	// The calls beyond the bound come last, so their answers mean every
	// call before them was taken.
	if err := tally.WaitAnswers(timeoutCtx(t, 60*time.Second), beyond); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls sent, %d waiting, %d answered at once after %s: %s", total, waiting, beyond,
		time.Since(sent).Round(time.Millisecond), memLine(t, pid))
	for i := 1 + waiting; i < total; i++ {
		m, ok := tally.Answer(fmt.Sprintf("t%05d", i))
		if !ok || m.Error == nil || !strings.Contains(m.Error.Message, "at most 10000 calls") || !strings.Contains(m.Error.Message, "--parallel 1") {
			t.Fatalf("call %d beyond the bound answered %s", i, m.Raw)
		}
	}
	if kids := childrenOf(pid); len(kids) != 1 {
		t.Errorf("%d runner processes, want 1 (--parallel 1)", len(kids))
	}
	eventually(t, 10*time.Second, "the status file to count the waiting calls", func() bool {
		st, err := status.Read(state)
		return err == nil && st.CallsQueued == waiting && st.CallsRunning == 1
	})

	// Every waiting call hears a heartbeat within 10 s of arriving.
	eventually(t, 30*time.Second, "a heartbeat for every waiting call", func() bool {
		return tally.EventsOfKind("heartbeat") >= waiting
	})
	t.Logf("after a round of %d heartbeats (%s after sending): %s", waiting, time.Since(sent).Round(time.Millisecond), memLine(t, pid))

	w.signal(syscall.SIGTERM)
	if err := tally.WaitAnswers(timeoutCtx(t, 60*time.Second), total); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	stopped := 0
	for id, m := range tally.Answers() {
		if m.Error != nil && m.Error.Type == "NodeCancelled" && m.Error.Message == "the worker is stopping" {
			stopped++
		} else if id <= fmt.Sprintf("t%05d", waiting) {
			t.Errorf("%s answered %s", id, m.Raw)
		}
	}
	if stopped != 1+waiting {
		t.Errorf("%d calls answered \"the worker is stopping\", want %d", stopped, 1+waiting)
	}
	if n := tally.EventsOfKind("started"); n != 1 {
		t.Errorf("%d runners started, want only the first call's", n)
	}
	if n := tally.Late(); n != 0 {
		t.Errorf("%d frames followed their call's answer", n)
	}
}

// A lost connection drops the waiting calls (the engine reschedules them)
// without starting them, and frees their slots for the next connection.
func TestLostConnectionDropsWaitingCalls(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "1", "--cancel-grace", "1s")
	wk := attach(t, eng)
	running := run(t, wk, "l0", step{"announce": true}, step{"sleep_ms": 60000})
	startedEvent(t, running)
	for i := 1; i <= 3; i++ {
		run(t, wk, fmt.Sprintf("l%d", i), step{"announce": true})
	}
	eventually(t, 10*time.Second, "the calls to wait", func() bool {
		return strings.Count(w.logs.String(), "call queued") == 3
	})
	wk.Drop()
	wk = attach(t, eng)
	eventually(t, 10*time.Second, "the runner to be gone", func() bool { return len(childrenOf(w.cmd.Process.Pid)) == 0 })
	if logs := w.logs.String(); strings.Contains(logs, "call started after waiting") || !strings.Contains(logs, "dropped with the connection") {
		t.Errorf("waiting calls were started, or their drop not logged:\n%s", logs)
	}
	// The slot is free: a new call starts at once, not behind ghosts.
	answer, events := wait(t, run(t, wk, "fresh", step{"announce": true}))
	if !answer.OK || !startedIn(events) {
		t.Errorf("after the drop: %s", answer.Raw)
	}
}
