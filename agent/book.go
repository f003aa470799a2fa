package agent

// The book of calls: which calls the engine awaits, which hold one of the
// --parallel runner slots, which wait for one (queue.go), and the counts
// --max-calls and --max-idle decide on. Each call's state (callstate.go)
// is the book's: every change to them is a method here, under one lock,
// so these hold:
//
//   - a call is in the book from its admission, before its pre-call hook
//     runs, so the duplicate check, --max-calls, the queue's bounds and
//     heartbeats see it wherever it is;
//   - at most --parallel calls hold a slot (slots ≤ parallel), vetting by
//     their pre-call hook or running, and a slot passes to a waiting call
//     only when its call's runner is gone;
//   - a call ends once: end counts it done only while the book holds it;
//   - with --max-calls, answered + running never exceeds it, since a call
//     is admitted only while there is room (full) and an ending call moves
//     from running to answered at most;
//   - a call is held through an outage (resume.go) at most once at a time,
//     and only while the book holds it: hold and unhold decide, and each
//     hold's grace timer stops it unless unhold wins.
//
// The book decides; the caller sends answers, logs and publishes counts
// outside the lock.

import (
	"fmt"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

type callBook struct {
	parallel int   // --parallel
	maxCalls int64 // --max-calls; 0: no bound

	mu       sync.Mutex
	calls    map[string]*call   // calls the engine awaits an answer for, waiting and vetting ones included
	live     map[*call]struct{} // calls holding a slot: their hook or processes may exist
	slots    int                // slots in use, at most parallel
	queue    callQueue          // calls waiting for a slot
	lastDone time.Time          // when a call last ended, or the last connection began
	done     int64              // calls ended, across reloads
	answered int64              // calls whose answer was sent, for --max-calls
}

func newCallBook(parallel, maxCalls int, done int64) *callBook {
	return &callBook{parallel: parallel, maxCalls: int64(maxCalls), done: done,
		calls: map[string]*call{}, live: map[*call]struct{}{}, lastDone: time.Now()}
}

// refusal is why a call is declined without running: the reason the
// metrics count it under, and the answer the engine gets (its error type
// and message). The reason is chosen where the call is declined: the book
// at admission (admit), the mode, the disk and the owner's policy and
// pre-call hook before and after it; dispatch's refuse answers it.
type refusal struct {
	reason metrics.DeclineReason
	typ    string // protocol.TypeNodeCancelled or protocol.TypeRemoteError
	msg    string
}

// admit takes c, a new call: it takes a free slot (start), vetting, or
// waits for one. It is refused, with the answer to send, when a call with
// its id is already here or the queue is full; it stays new.
func (b *callBook) admit(c *call) (start bool, no *refusal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if other, dup := b.calls[c.id]; dup {
		state := "running"
		switch other.state {
		case callWaiting:
			state = "waiting for a free slot"
		case callVetting:
			if other.preCall != nil {
				state = "waiting for this worker's pre-call hook"
			}
		}
		return false, &refusal{metrics.DeclinedInvalid, protocol.TypeRemoteError,
			fmt.Sprintf("a call with call_id %q is already %s on this worker; this duplicate was not started", logging.Cut(c.id, maxLoggedID), state)}
	}
	start = b.slots < b.parallel
	switch {
	case start:
		b.slots++
		b.live[c] = struct{}{}
		c.move(callVetting)
	case !b.queue.fits(c.size):
		return false, &refusal{metrics.DeclinedQueueFull, protocol.TypeRemoteError, b.queue.fullError(b.parallel)}
	default:
		b.queue.push(c)
	}
	b.calls[c.id] = c
	return start, nil
}

// lookup is the call with id the engine awaits, nil if none.
func (b *callBook) lookup(id string) *call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[id]
}

// full reports whether --max-calls leaves no room for another call: the
// calls answered and those running (which may yet be answered) fill it.
func (b *callBook) full() bool {
	if b.maxCalls <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answered+int64(len(b.calls)) >= b.maxCalls
}

// leaveQueue takes the call id out of the queue if it waits there: the
// engine cancelled it, and it is leaving. It returns the call, nil if none
// is here.
func (b *callBook) leaveQueue(id string) (c *call, waiting bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c = b.calls[id]
	return c, c != nil && b.queue.remove(c)
}

// begin moves c, vetting, to running: its runner starts.
func (b *callBook) begin(c *call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c.move(callRunning)
}

// decline ends c, vetting, without running it: its pre-call hook declined
// it, it was stopped or cancelled meanwhile, or its connection is gone. It
// is not counted among the calls done, nor answered for --max-calls, as a
// call refused at its arrival is not; it keeps its slot until next.
func (b *callBook) decline(c *call) (running, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c.move(callEnded)
	if b.calls[c.id] == c {
		delete(b.calls, c.id)
	}
	return b.countsLocked()
}

// end counts c's end: answered when the engine got its answer. It
// reports false for a call the book does not hold (ended already, or
// dropped with its connection): nothing is counted twice. lastAllowed says
// this answer is the one that fills --max-calls; from is the state c
// ended from (leaving: it never had a slot).
func (b *callBook) end(c *call, answered bool) (ok bool, from callState, running, waiting int, done int64, lastAllowed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.calls[c.id] != c {
		return false, c.state, 0, 0, b.done, false
	}
	from = c.state
	if from == callHeld {
		// Answered and delivered just as its connection was lost: nothing
		// is left to hold.
		c.holdTimer.Stop()
		c.holdTimer = nil
	}
	c.move(callEnded)
	delete(b.calls, c.id)
	b.lastDone = time.Now()
	b.done++
	if answered {
		b.answered++
		lastAllowed = b.maxCalls > 0 && b.answered == b.maxCalls
	}
	running, waiting = b.countsLocked()
	return true, from, running, waiting, b.done, lastAllowed
}

// next passes the slot of prev, whose runner is gone (or which ended
// vetting), to the next waiting call (take false: to none; the slot is
// given back). The call returned holds the slot now, vetting.
func (b *callBook) next(prev *call, take bool) (c *call, running, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, prev)
	if take {
		c = b.queue.pop()
	}
	if c == nil {
		b.slots--
	} else {
		b.live[c] = struct{}{}
	}
	running, waiting = b.countsLocked()
	return c, running, waiting
}

// takeWaiting empties the queue; the calls stay the engine's to answer.
func (b *callBook) takeWaiting() []*call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queue.takeAll()
}

// dropWaiting empties the queue and forgets its calls: their connection is
// gone and nobody awaits them.
func (b *callBook) dropWaiting() (dropped []*call, running int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dropped = b.queue.takeAll()
	for _, c := range dropped {
		c.move(callEnded)
		if b.calls[c.id] == c {
			delete(b.calls, c.id)
		}
	}
	running, _ = b.countsLocked()
	return dropped, running
}

// appendAwaiting appends to buf the calls that wait now, for a slot or on
// their pre-call hook: the calls whose heartbeats are beatWaiting's.
func (b *callBook) appendAwaiting(buf []*call) []*call {
	b.mu.Lock()
	defer b.mu.Unlock()
	buf = b.queue.appendWaiting(buf)
	for c := range b.live {
		if c.state == callVetting {
			buf = append(buf, c)
		}
	}
	return buf
}

// countsLocked is how many calls run (the engine awaits their answers;
// vetting ones included, since they hold a slot) and how many wait for a
// slot.
func (b *callBook) countsLocked() (running, waiting int) {
	return len(b.calls) - b.queue.n, b.queue.n
}

// counts is how many calls run and how many wait for a slot.
func (b *callBook) counts() (running, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.countsLocked()
}

// running is how many calls the engine awaits, waiting ones included.
func (b *callBook) running() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

// doneSoFar is how many calls the engine awaits and how many ended.
func (b *callBook) doneSoFar() (running int, done int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls), b.done
}

// idleSince is when a call last ended, or the last connection began.
func (b *callBook) idleSince() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastDone
}

// restartIdle starts the idle clock again: a fresh connection.
func (b *callBook) restartIdle() {
	b.mu.Lock()
	b.lastDone = time.Now()
	b.mu.Unlock()
}

// each calls fn for every call the engine awaits (calls ordered by
// nothing), under the book's lock: fn may read and set the call's
// fields the lock guards, and must not call the book.
func (b *callBook) each(fn func(*call)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.calls {
		fn(c)
	}
}

// eachLive is each for the calls that hold a slot.
func (b *callBook) eachLive(fn func(*call)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range b.live {
		fn(c)
	}
}

// heldCall is a call held through an outage, and when its hold began.
type heldCall struct {
	*call
	since time.Time
}

// hold holds every call that outlives its connection (it has a journal)
// and runs: each is stopped by expire when its grace runs out, unless
// unhold comes first. It returns the calls it held.
func (b *callBook) hold(expire func(*call)) []heldCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	var held []heldCall
	for _, c := range b.calls {
		if c.journal == nil || c.state != callRunning {
			continue
		}
		c.move(callHeld)
		c.journal.Detach()
		c.heldAt = time.Now()
		c.holdTimer = time.AfterFunc(c.grace, func() { expire(c) })
		held = append(held, heldCall{c, c.heldAt})
	}
	return held
}

// unhold ends c's hold, and says when it began; ok is false when c was
// not held (any more): another unhold won.
func (b *callBook) unhold(c *call) (since time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.state != callHeld {
		return time.Time{}, false
	}
	c.move(callRunning)
	c.holdTimer.Stop()
	c.holdTimer = nil
	return c.heldAt, true
}

// held lists the calls held now (ordered by nothing).
func (b *callBook) held() []heldCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	var held []heldCall
	for _, c := range b.calls {
		if c.state == callHeld {
			held = append(held, heldCall{c, c.heldAt})
		}
	}
	return held
}
