package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/metrics"
)

// checkSlots fails when the book's slot count is off: never above
// --parallel, always one per call that holds a slot.
func checkSlots(t *testing.T, b *callBook) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.slots > b.parallel || b.slots != len(b.live) || b.slots < 0 {
		t.Fatalf("%d slots in use, %d calls holding one, --parallel %d", b.slots, len(b.live), b.parallel)
	}
}

// At --parallel 2, two calls start and the rest wait; each freed slot
// goes to the next waiting call in arrival order, and once none waits the
// slots are given back. Slots never exceed --parallel on the way.
func TestBookSlotsNeverExceedParallel(t *testing.T) {
	t.Parallel()
	b := newCallBook(2, 0, 0)
	calls := make([]*call, 5)
	for i := range calls {
		calls[i] = &call{id: fmt.Sprint("c", i), size: 10}
		start, refusal := b.admit(calls[i])
		if refusal != nil || start != (i < 2) {
			t.Fatalf("call %d: start %v, refusal %+v", i, start, refusal)
		}
		if start {
			b.begin(calls[i]) // its pre-call hook (none here) took it
		}
		checkSlots(t, b)
	}
	if running, waiting := b.counts(); running != 2 || waiting != 3 {
		t.Fatalf("%d running, %d waiting; want 2 and 3", running, waiting)
	}
	// c0's runner is gone: c2 takes its slot; c1's: c3.
	for i, want := range []string{"c2", "c3"} {
		next, _, _ := b.next(calls[i], true)
		if next == nil || next.id != want {
			t.Fatalf("the slot of c%d went to %v, want %s", i, next, want)
		}
		b.begin(next)
		checkSlots(t, b)
		b.end(calls[i], true)
	}
	// A stopping worker takes no waiting call: the slot is given back.
	if next, _, _ := b.next(calls[2], false); next != nil {
		t.Fatalf("a slot freed while stopping went to %s", next.id)
	}
	checkSlots(t, b)
	if next, _, _ := b.next(calls[3], true); next == nil || next.id != "c4" {
		t.Fatalf("the last slot went to %v, want c4", next)
	}
	if next, _, _ := b.next(calls[4], true); next != nil {
		t.Fatalf("with nothing waiting the slot went to %s", next.id)
	}
	checkSlots(t, b)
	if b.slots != 0 {
		t.Fatalf("%d slots in use with no call running", b.slots)
	}
}

// A call ends once: a second end of it, or the end of a call dropped with
// its connection, counts nothing.
func TestBookEachCallEndsOnce(t *testing.T) {
	t.Parallel()
	b := newCallBook(1, 0, 7) // 7 calls done before a reload
	running := &call{id: "r"}
	waiting := &call{id: "w"}
	b.admit(running)
	b.begin(running)
	b.admit(waiting)
	dropped, left := b.dropWaiting()
	if len(dropped) != 1 || dropped[0] != waiting || left != 1 {
		t.Fatalf("dropWaiting took %d calls, left %d running", len(dropped), left)
	}
	if ok, _, _, _, _, _ := b.end(waiting, false); ok {
		t.Error("a call dropped with its connection ended as if it ran")
	}
	ok, _, r, w, done, _ := b.end(running, true)
	if !ok || r != 0 || w != 0 || done != 8 {
		t.Fatalf("the end of the running call: ok %v, %d running, %d waiting, %d done; want true, 0, 0, 8", ok, r, w, done)
	}
	if ok, _, _, _, done, _ := b.end(running, true); ok || done != 8 {
		t.Fatalf("a second end of the same call: ok %v, %d done; want false, 8", ok, done)
	}
	b.next(running, true) // its runner is gone; nothing waits
	// A call of the same id later is a new call, and ends on its own.
	again := &call{id: "r"}
	if _, refusal := b.admit(again); refusal != nil {
		t.Fatalf("a new call with an ended call's id refused: %s", refusal.msg)
	}
	b.begin(again)
	if ok, _, _, _, _, _ := b.end(running, true); ok {
		t.Error("the old call's end ended the new call of its id")
	}
	if ok, _, _, _, done, _ := b.end(again, false); !ok || done != 9 {
		t.Fatalf("the new call's end: ok %v, %d done", ok, done)
	}
}

// With --max-calls 3, answered + running never exceeds 3: the book is
// full while the calls running could fill it, the third answer is the one
// that says so, and a call that ended unanswered leaves room.
func TestBookMaxCallsAnsweredPlusRunning(t *testing.T) {
	t.Parallel()
	b := newCallBook(4, 3, 0)
	admit := func(id string) *call {
		t.Helper()
		if b.full() {
			t.Fatalf("full before admitting %s", id)
		}
		c := &call{id: id}
		if _, refusal := b.admit(c); refusal != nil {
			t.Fatal(refusal.msg)
		}
		b.begin(c)
		return c
	}
	a, bb, c := admit("a"), admit("b"), admit("c")
	if !b.full() {
		t.Fatal("3 running calls leave room under --max-calls 3")
	}
	if _, _, _, _, _, last := b.end(a, true); last {
		t.Fatal("the first answer was taken as the last allowed")
	}
	if _, _, _, _, _, last := b.end(bb, false); last { // stopped, never answered
		t.Fatal("an unanswered end was counted as answered")
	}
	if b.full() {
		t.Fatal("1 answered + 1 running is full under --max-calls 3")
	}
	d := admit("d")
	if !b.full() {
		t.Fatal("1 answered + 2 running leaves room under --max-calls 3")
	}
	b.end(c, true)
	if _, _, _, _, _, last := b.end(d, true); !last {
		t.Fatal("the third answer did not say --max-calls is answered")
	}
	if !b.full() {
		t.Fatal("--max-calls answered, yet the book takes more")
	}
}

// A duplicate call_id is refused, saying whether the first runs or waits;
// a call beyond the queue's bound is refused with the bound and --parallel.
func TestBookRefusals(t *testing.T) {
	t.Parallel()
	b := newCallBook(1, 0, 0)
	b.admit(&call{id: "run"})
	b.admit(&call{id: "wait"})
	for id, want := range map[string]string{"run": "already running", "wait": "already waiting for a free slot"} {
		start, refusal := b.admit(&call{id: id})
		if start || refusal == nil || !strings.Contains(refusal.msg, want) || refusal.reason != metrics.DeclinedInvalid {
			t.Errorf("a duplicate of %s: start %v, refusal %+v; want it to say %q, counted as %q", id, start, refusal, want, metrics.DeclinedInvalid)
		}
	}
	for i := 1; i < maxQueuedCalls; i++ {
		if _, refusal := b.admit(&call{id: fmt.Sprint(i)}); refusal != nil {
			t.Fatalf("call %d refused: %s", i, refusal.msg)
		}
	}
	_, refusal := b.admit(&call{id: "beyond"})
	if refusal == nil || refusal.reason != metrics.DeclinedQueueFull || !strings.Contains(refusal.msg, "--parallel 1") {
		t.Fatalf("a call beyond the queue's bound: %+v", refusal)
	}
	if running, waiting := b.counts(); running != 1 || waiting != maxQueuedCalls {
		t.Fatalf("%d running, %d waiting after the refusals", running, waiting)
	}
}
