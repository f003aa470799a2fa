package agent

import (
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/moves"
	"github.com/fluksio/fluksio-worker/agent/moves/movestest"
)

// An illegal move of a call is a bug: in this package's tests it panics.
func init() { moves.PanicOnIllegal = true }

var allCallStates = []callState{callNew, callWaiting, callVetting, callRunning, callHeld, callLeaving, callEnded}

// Every move between two of a call's states, legal or not, without a
// session: the legal ones are the diagram's (callstate.go), each made
// once; every other one is refused (moves.Table.Try) and changes nothing.
func TestCallStateMoves(t *testing.T) {
	legal := map[[2]callState]bool{
		{callNew, callWaiting}:     true, // admitted, every slot busy
		{callNew, callVetting}:     true, // admitted on a free slot
		{callWaiting, callVetting}: true, // a slot freed: it takes it
		{callWaiting, callLeaving}: true, // cancelled, stopped or dropped while waiting
		{callVetting, callRunning}: true, // its pre-call hook took it (or there is none)
		{callVetting, callEnded}:   true, // declined, cancelled, stopped or dropped in its hook
		{callRunning, callHeld}:    true, // its connection is lost; it outlives it
		{callRunning, callEnded}:   true, // answered, or stopped with its connection
		{callHeld, callRunning}:    true, // an engine claimed it, or its hold was stopped
		{callHeld, callEnded}:      true, // delivered just as its connection was lost
		{callLeaving, callEnded}:   true, // answered or dropped without a slot
	}
	movestest.Check(t, callMoves, allCallStates, legal)
}

// Every state's names are distinct and said.
func TestCallStateString(t *testing.T) {
	seen := map[string]bool{}
	for _, st := range allCallStates {
		name := st.String()
		if name == "unknown" || seen[name] {
			t.Errorf("state %d is named %q", st, name)
		}
		seen[name] = true
	}
}

// A call whose pre-call hook runs is in the book, holding its slot: a
// duplicate of it is refused saying so, it counts as running and toward
// --max-calls, it gets its heartbeats from the book, the next call waits
// for its slot; declined, it leaves the book without counting as done or
// answered, and its slot goes to the next call.
func TestBookHoldsVettingCalls(t *testing.T) {
	t.Parallel()
	b := newCallBook(1, 2, 0)
	vetting := &call{id: "v", preCall: []byte(`{"call_id":"v"}`)}
	if start, no := b.admit(vetting); !start || no != nil || vetting.state != callVetting {
		t.Fatalf("the first call: start %v, refusal %+v, %s; want it vetting on the free slot", start, no, vetting.state)
	}
	_, no := b.admit(&call{id: "v"})
	if no == nil || no.reason != metrics.DeclinedInvalid || !strings.Contains(no.msg, "already waiting for this worker's pre-call hook") {
		t.Fatalf("a duplicate of a vetting call: %+v", no)
	}
	if running, waiting := b.counts(); running != 1 || waiting != 0 {
		t.Fatalf("%d running, %d waiting; want the vetting call running", running, waiting)
	}
	if beating := b.appendAwaiting(nil); len(beating) != 1 || beating[0] != vetting {
		t.Fatalf("the calls the book heartbeats: %v; want the vetting call", beating)
	}
	next := &call{id: "n"}
	if start, _ := b.admit(next); start || next.state != callWaiting {
		t.Fatalf("a call behind a vetting one: start %v, %s; want it waiting", start, next.state)
	}
	if !b.full() {
		t.Fatal("a vetting and a waiting call leave room under --max-calls 2")
	}
	if beating := b.appendAwaiting(nil); len(beating) != 2 {
		t.Fatalf("the book heartbeats %d calls; want the vetting and the waiting one", len(beating))
	}
	// Its hook declines it.
	if running, waiting := b.decline(vetting); running != 0 || waiting != 1 || vetting.state != callEnded {
		t.Fatalf("after the decline: %d running, %d waiting, the call %s", running, waiting, vetting.state)
	}
	if ok, _, _, _, done, _ := b.end(vetting, true); ok || done != 0 {
		t.Fatalf("a declined call ended again: ok %v, %d done", ok, done)
	}
	if b.full() {
		t.Fatal("a declined call still counts toward --max-calls")
	}
	if c, _, _ := b.next(vetting, true); c != next || next.state != callVetting {
		t.Fatalf("the declined call's slot went to %v (%s); want the waiting call, vetting", c, next.state)
	}
	checkSlots(t, b)
	if _, done := b.doneSoFar(); done != 0 {
		t.Fatalf("%d calls done; a declined call is not done", done)
	}
}
