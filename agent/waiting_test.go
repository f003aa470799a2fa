package agent_test

// Calls beyond --parallel: they wait in order, with heartbeats, and a
// stop, a drain, a cancel or a lost connection each does what it says to
// them; never more than --parallel runners at once. In this process, the
// test binary as the runner.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// At most --parallel runner processes exist at once, however many calls
// the engine sends; the rest wait and then run.
func TestParallelIsEnforced(t *testing.T) {
	// Not parallel: it counts this process's runners.
	f := serveFake(t, enginetest.Options{}, "--parallel", "2")
	wk := f.wk
	var most atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if n := int64(len(liveChildren())); n > most.Load() {
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

// Calls beyond --parallel wait in arrival order; while they wait they get
// heartbeats, a duplicate of one is refused, and a cancel of one is
// answered NodeCancelled without starting anything.
func TestWaitingCallsRunInOrderWithHeartbeats(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the 10 s heartbeat")
	}
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1")
	wk := f.wk
	first := run(t, wk, "w0", step{"announce": true}, step{"sleep_ms": 11000})
	started(t, first)
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
	logs := f.log.String()
	const started = `msg="call started after waiting for a slot" call_id=`
	if i, j := strings.Index(logs, started+"w1 "), strings.Index(logs, started+"w3 "); i < 0 || j < i {
		t.Errorf("w1 and w3 did not start in arrival order after waiting (at %d and %d in the log)", i, j)
	}
}

// A stop answers the waiting calls NodeCancelled, "the worker is
// stopping", without starting them.
func TestStopAnswersWaitingCallsWithoutStartingThem(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--cancel-grace", "1s")
	wk := f.wk
	running := run(t, wk, "s0", step{"announce": true}, step{"sleep_ms": 60000})
	started(t, running)
	waiting := []*enginetest.Call{run(t, wk, "s1", step{"announce": true}), run(t, wk, "s2", step{"announce": true})}
	queued(t, f, 2)
	f.a.Stop()
	for _, c := range append(waiting, running) {
		answer, events := wait(t, c)
		if answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the worker is stopping" {
			t.Errorf("%s answered %s", c.ID, answer.Raw)
		}
		if c != running && startedIn(events) {
			t.Errorf("%s was started after the stop: %q", c.ID, rawOf(events))
		}
	}
	if err := f.result(t); err != nil {
		t.Fatalf("Serve after Stop: %v", err)
	}
}

// A drain declines new calls, but calls already waiting were accepted:
// they run, in turn, before the worker exits.
func TestDrainRunsWaitingCalls(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1")
	wk := f.wk
	first := run(t, wk, "q0", step{"announce": true}, step{"sleep_ms": 1500})
	started(t, first)
	second := run(t, wk, "q1", step{"announce": true})
	queued(t, f, 1)
	f.a.Drain()
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
	if err := f.result(t); err != nil {
		t.Fatalf("Serve after a drain: %v", err)
	}
}

// A lost connection drops the waiting calls (the engine reschedules them)
// without starting them, and frees their slots for the next connection.
func TestLostConnectionDropsWaitingCalls(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--cancel-grace", "1s")
	wk := f.wk
	running := run(t, wk, "l0", step{"announce": true}, step{"sleep_ms": 60000})
	pid := started(t, running)
	for i := 1; i <= 3; i++ {
		run(t, wk, fmt.Sprintf("l%d", i), step{"announce": true})
	}
	queued(t, f, 3)
	wk.Drop()
	wk = f.attach(t)
	eventually(t, goneTimeout, "the runner to be gone", func() bool { return !platform.ProcessAlive(pid) })
	if logs := f.log.String(); strings.Contains(logs, "call started after waiting") || !strings.Contains(logs, "dropped with the connection") {
		t.Errorf("waiting calls were started, or their drop not logged:\n%s", logs)
	}
	// The slot is free: a new call starts at once, not behind ghosts.
	answer, events := wait(t, run(t, wk, "fresh", step{"announce": true}))
	if !answer.OK || !startedIn(events) {
		t.Errorf("after the drop: %s", answer.Raw)
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

// queued waits until n calls were queued in the worker's log.
func queued(t *testing.T, f *fake, n int) {
	t.Helper()
	eventually(t, goneTimeout, fmt.Sprintf("%d calls to wait for a slot", n), func() bool {
		return strings.Count(f.log.String(), "call queued") == n
	})
}

// liveChildren lists this process's children that are running.
func liveChildren() []int {
	var kids []int
	for pid := range children() {
		if state, _, _ := procStat(pid); state != "Z" {
			kids = append(kids, pid)
		}
	}
	return kids
}

func timeoutCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
