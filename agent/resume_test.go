package agent_test

// The resume extension (RESUME.md) from the engine's side, in this
// process: the fake engine accepts it, and the worker serving it holds its
// calls through outages the test makes.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/platform"
)

// resumeNodes: paced yields i = 0 .. n-1, one every pace_ms, then returns n.
const resumeNodes = `
import time
from fluksio import Port, node

@node(requires=[Port("n", "int"), Port("pace_ms", "int")],
      provides=[Port("i", "int", stream=True), Port("count", "int")])
def paced(n, pace_ms):
    for i in range(n):
        yield {"i": i}
        time.sleep(pace_ms / 1000.0)
    return n
`

func pacedCall(id string, n, paceMS int) map[string]any {
	return sourceCall(resumeNodes, "resume_nodes.py", id, "paced", map[string]any{"n": n, "pace_ms": paceMS})
}

// startResumeSession is a session whose engine accepts the extension with
// grace; it has read the worker's first resume message (a fresh worker
// holds nothing).
func startResumeSession(t *testing.T, grace time.Duration, extra ...string) *session {
	t.Helper()
	s := startSessionWith(t, enginetest.Options{Resume: grace}, extra...)
	held := resumedOn(t, s.wk)
	if len(held.Calls) != 0 {
		t.Fatalf("a fresh worker says it holds %+v", held.Calls)
	}
	return s
}

// resumedOn is the worker's resume message on wk.
func resumedOn(t *testing.T, wk *enginetest.Worker) protocol.ResumeHello {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	msg, err := wk.Resumed(ctx)
	if err != nil {
		t.Fatalf("no resume message after an accepting welcome: %v", err)
	}
	return msg
}

// nextWorker waits for the worker to attach again.
func (s *session) nextWorker(t *testing.T, timeout time.Duration) *enginetest.Worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	wk, err := s.eng.NextWorker(ctx)
	if err != nil {
		t.Fatalf("the worker did not attach again: %v", err)
	}
	return wk
}

// streamed waits for the call's next stream event.
func streamed(t *testing.T, c *enginetest.Call) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for {
		m, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.IsAnswer() {
			t.Fatalf("the call ended early: %s", m.Raw)
		}
		if m.Event == "stream" {
			return
		}
	}
}

// heldThroughRestart runs a long paced call with id, restarts the engine
// once it streams, and returns the call and the worker's next connection,
// whose resume message says it holds the call, running.
func (s *session) heldThroughRestart(t *testing.T, id string) (*enginetest.Call, *enginetest.Worker) {
	t.Helper()
	c, err := s.wk.Run(pacedCall(id, 100000, 50))
	if err != nil {
		t.Fatal(err)
	}
	streamed(t, c)
	if err := s.eng.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wk := s.nextWorker(t, attachTimeout)
	if held := resumedOn(t, wk); len(held.Calls) != 1 || held.Calls[0].CallID != id || held.Calls[0].Done {
		t.Fatalf("the worker says it holds %+v; want the running call %s", held.Calls, id)
	}
	return c, wk
}

// A continue the worker cannot serve (the engine claims frames the call
// never sent) stops the call, and its answer is the error RESUME.md
// documents, not the runtime's answer to the stop.
func TestUnservableContinueIsAnsweredWithTheReason(t *testing.T) {
	s := startResumeSession(t, 10*time.Minute)
	s.eng.ContinueAt("far", 1<<40)
	c, _ := s.heldThroughRestart(t, "far")
	answer, _, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	const want = "the call's events cannot be replayed from where the engine asks: "
	if answer.OK || answer.Error == nil || answer.Error.Type != protocol.TypeNodeCancelled || !strings.HasPrefix(answer.Error.Message, want) {
		t.Fatalf("answer %s; want a NodeCancelled error saying %q...", answer.Raw, want)
	}
}

// While calls are held the worker tries to attach again often enough that
// an engine back within the grace finds them held: not with a backoff that
// has doubled to 30 s. The engine stays down for five failed attempts (15 s
// at least with a backoff doubling from 1 s), then comes back; its grace is
// 24 s.
func TestEngineBackWithinTheGraceFindsItsCalls(t *testing.T) {
	s := startResumeSession(t, 24*time.Second)
	c, err := s.wk.Run(pacedCall("long", 100000, 50))
	if err != nil {
		t.Fatal(err)
	}
	streamed(t, c)
	s.eng.GoDown()
	retries := func() int {
		log := s.log.String()
		return strings.Count(log, "connection lost; reconnecting") + strings.Count(log, "cannot reach the engine; retrying")
	}
	// The lost connection, then five attempts that failed.
	eventually(t, 2*time.Minute, "five failed attempts to attach after the engine went down", func() bool { return retries() >= 6 })
	if err := s.eng.ComeBack(); err != nil {
		t.Fatal(err)
	}
	wk := s.nextWorker(t, 2*time.Minute)
	if held := resumedOn(t, wk); len(held.Calls) != 1 || held.Calls[0].CallID != "long" {
		t.Fatalf("the worker says it holds %+v; want the call long, within its grace", held.Calls)
	}
	streamed(t, c)
}

// valuesOf is the "i" of each stream event, in the order they came.
func valuesOf(events []enginetest.Message) []int {
	var got []int
	for _, m := range events {
		var v struct {
			Values struct{ I int } `json:"values"`
		}
		if m.Event == "stream" && m.Decode(&v) == nil {
			got = append(got, v.Values.I)
		}
	}
	return got
}

// bulkNodes: bulk yields i = 0 .. n-1 with size bytes of padding each,
// writing how many it yielded to the file progress after each.
const bulkNodes = `
from fluksio import Port, node

@node(requires=[Port("n", "int"), Port("size", "int"), Port("progress", "str")],
      provides=[Port("i", "int", stream=True), Port("pad", "str", stream=True), Port("count", "int")])
def bulk(n, size, progress):
    pad = "x" * size
    for i in range(n):
        yield {"i": i, "pad": pad}
        with open(progress, "w") as f:
            f.write(str(i + 1))
    return n
`

// An engine that stops reading (hung) while a call writes far more than
// 4 MiB, then restarts: what it never read was in the worker's queue and
// the sockets' buffers when the connection died, and the worker still has
// all of it. The engine gets every value once, in order, and the answer.
func TestHungEngineGetsEverythingInFlight(t *testing.T) {
	const n, size, inFlight = 400, 32 << 10, 300 // 300 frames of 32 KiB: over 9 MiB in flight
	shared := t.TempDir()                        // where the node tells the test how far it got
	s := startResumeSession(t, 10*time.Minute, "--sandbox-bind", shared+":rw")
	progress := filepath.Join(shared, "progress")
	s.wk.PauseReads(10 * time.Minute)
	c, err := s.wk.Run(sourceCall(bulkNodes, "bulk_nodes.py", "bulk", "bulk",
		map[string]any{"n": n, "size": size, "progress": progress}))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, callTimeout, fmt.Sprintf("the node to yield %d values the engine does not read", inFlight), func() bool {
		b, _ := os.ReadFile(progress)
		got, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return got >= inFlight
	})
	if err := s.eng.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wk := s.nextWorker(t, attachTimeout)
	if held := resumedOn(t, wk); len(held.Calls) != 1 || held.Calls[0].CallID != "bulk" {
		t.Fatalf("the worker says it holds %+v; want the call bulk", held.Calls)
	}
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if !answer.OK {
		t.Fatalf("answer %.500s; want the node's own (%d values were in flight)", answer.Raw, inFlight)
	}
	got := valuesOf(events)
	for i, v := range got {
		if v != i {
			t.Fatalf("value %d is %d: a value was lost, repeated or reordered", i, v)
		}
	}
	if len(got) != n {
		t.Fatalf("%d values arrived, want %d", len(got), n)
	}
}

// pidNodes: quick writes its pid to the file pidfile, yields i = 0 .. n-1
// and returns n.
const pidNodes = `
import os
from fluksio import Port, node

@node(requires=[Port("n", "int"), Port("pidfile", "str")],
      provides=[Port("i", "int", stream=True), Port("count", "int")])
def quick(n, pidfile):
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    for i in range(n):
        yield {"i": i}
    return n
`

// An engine that asks for acknowledged answers gets an answer exactly once
// even when the connection it was written to dies before the engine read
// it: the worker keeps the call, lists it done, and replays its answer; the
// engine's acknowledgement ends it.
func TestAcknowledgedAnswerSurvivesItsConnection(t *testing.T) {
	shared := t.TempDir() // where the node says its pid
	s := startSessionWith(t, enginetest.Options{Resume: 10 * time.Minute, ResumeAck: true}, "--sandbox-bind", shared+":rw")
	if held := resumedOn(t, s.wk); len(held.Calls) != 0 {
		t.Fatalf("a fresh worker says it holds %+v", held.Calls)
	}
	pidfile := filepath.Join(shared, "pid")
	s.wk.PauseReads(10 * time.Minute) // the engine never reads the answer on this connection
	c, err := s.wk.Run(sourceCall(pidNodes, "pid_nodes.py", "acked", "quick", map[string]any{"n": 5, "pidfile": pidfile}))
	if err != nil {
		t.Fatal(err)
	}
	// The runner goes once the answer went to the connection.
	eventually(t, callTimeout, "the call's runner to answer and be gone", func() bool {
		b, err := os.ReadFile(pidfile)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0 && !platform.ProcessAlive(pid)
	})
	if err := s.eng.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wk := s.nextWorker(t, attachTimeout)
	held := resumedOn(t, wk)
	if len(held.Calls) != 1 || held.Calls[0].CallID != "acked" || !held.Calls[0].Done {
		t.Fatalf("the worker says it holds %+v; want the call acked, done, its answer unacknowledged", held.Calls)
	}
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if !answer.OK {
		t.Fatalf("answer %s", answer.Raw)
	}
	got := valuesOf(events)
	if fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Fatalf("values %v; want each of 0 .. 4 once, in order", got)
	}
	// Acknowledged, the call is over: the next connection lists nothing.
	eventually(t, callTimeout, "the acknowledged call to end", func() bool {
		return strings.Contains(s.log.String(), "call ended")
	})
	if err := s.eng.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if held := resumedOn(t, s.nextWorker(t, attachTimeout)); len(held.Calls) != 0 {
		t.Fatalf("after the acknowledgement the worker still holds %+v", held.Calls)
	}
}

// A worker told to stop does not wait for acknowledgements an engine
// withholds: it stops as it would without them.
func TestStopDoesNotWaitForAcknowledgements(t *testing.T) {
	s := startSessionWith(t, enginetest.Options{Resume: 10 * time.Minute, ResumeAck: true})
	resumedOn(t, s.wk)
	s.eng.WithholdAcks()
	c, err := s.wk.Run(pacedCall("unacked", 2, 10))
	if err != nil {
		t.Fatal(err)
	}
	if answer, _, err := c.WaitTimeout(callTimeout); err != nil || !answer.OK {
		t.Fatalf("answer %s, %v", answer.Raw, err)
	}
	s.stop()
	select {
	case err := <-s.served:
		s.served <- err // for the cleanup
	case <-time.After(goneTimeout):
		t.Fatalf("Serve did not return within %s of Stop: it waits for an acknowledgement", goneTimeout)
	}
}

// A held call keeps its call_id: a run with the same id on the next
// connection is refused as a duplicate, as RESUME.md says.
func TestCallIDOfAHeldCallIsTaken(t *testing.T) {
	s := startResumeSession(t, 10*time.Minute)
	_, wk := s.heldThroughRestart(t, "same")
	again, err := wk.Run(pacedCall("same", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	answer, _, err := again.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if answer.OK || answer.Error == nil || answer.Error.Type != protocol.TypeRemoteError || !strings.Contains(answer.Error.Message, "is already running on this worker") {
		t.Fatalf("answer %s; want the duplicate refused", answer.Raw)
	}
}
