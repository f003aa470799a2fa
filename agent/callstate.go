package agent

// A call's life as one state, owned by the book (book.go) and moved only
// by it, under its lock:
//
//	new ──▶ waiting ──▶ vetting ──▶ running ◀──▶ held
//	 │         │           │           │          │
//	 │         ▼           │           ▼          │
//	 │      leaving ───────┴─────▶  ended  ◀──────┘
//	 └──────────────────▲
//	   (new ──▶ vetting: a slot was free)
//
// A call the engine sends is admitted into the book before anything of it
// runs: on a free slot it is vetting at once, otherwise it waits in the
// queue. Vetting, it holds one of the --parallel slots while its pre-call
// hook decides whether it runs (at once, without a hook), so at most
// --parallel hooks run at a time; declined, cancelled or dropped with its
// connection there, it ends without running. A waiting call a cancel, a
// stop or a lost connection takes out of the queue is leaving: answered
// (or dropped) without a slot. A running call whose connection is lost and
// that may outlive it (resume.go) is held, and running again when an engine
// claims it. Every call ends once.

import "github.com/fluksio/fluksio-worker/agent/moves"

// callState is where a call is in its life; guarded by callBook.mu.
type callState uint8

const (
	callNew     callState = iota // made, not in the book yet (a refused duplicate stays so)
	callWaiting                  // in the book and the queue, waiting for a slot
	callVetting                  // holds a slot; its pre-call hook decides whether it runs
	callRunning                  // holds a slot; its runner starts or runs
	callHeld                     // running through an outage, its grace timer armed (resume.go)
	callLeaving                  // out of the queue, answered or dropped without a slot
	callEnded                    // out of the book (final)
)

// callMoves is every legal move: from a state, the states it may go to.
var callMoves = moves.Table[callState]{
	callNew:     {callWaiting, callVetting},
	callWaiting: {callVetting, callLeaving},
	callVetting: {callRunning, callEnded},
	callRunning: {callHeld, callEnded},
	callHeld:    {callRunning, callEnded},
	callLeaving: {callEnded},
}

// move changes c's state to, a move its caller knows is legal (it holds
// the book's lock and saw the state it moves from). An illegal one is a
// bug in the book, and loud (moves.Table.Must): a panic under test, an
// error in the call's log otherwise, where the worker goes on; it changes
// nothing.
func (c *call) move(to callState) {
	callMoves.Must(&c.state, to, "a call", "the worker's book of calls", c.log)
}

// String names a state in the log and the tests' messages.
func (st callState) String() string {
	switch st {
	case callNew:
		return "new"
	case callWaiting:
		return "waiting"
	case callVetting:
		return "vetting"
	case callRunning:
		return "running"
	case callHeld:
		return "held"
	case callLeaving:
		return "leaving"
	case callEnded:
		return "ended"
	}
	return "unknown"
}
