package agent

// The calls that wait for a free runner slot. At most --parallel runner
// processes exist at once; a call that arrives while they are all busy
// waits here, in arrival order, and the slot that frees first takes the
// next one (see runSlot). A waiting call is a few hundred bytes plus its
// request: no goroutine, no process, no pipe.

import (
	"fmt"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// The queue's bounds. The engine is told max_parallel in hello, so a
// well-behaved engine has at most about --parallel calls waiting (a call
// it sees answered while its process is still exiting). Engines written
// against the Python agent, which ran every call it got at once, may
// send a pipeline's whole fan-out instead; those calls should wait and
// run, not fail. 10,000 waiting calls of a typical request (a few KiB)
// cost tens of MiB and one heartbeat frame each per 10 s; beyond that the
// engine is not scheduling at all, and a call is better answered at once
// than held for hours. The byte bound keeps requests that carry large
// sources from holding more than a bounded amount of memory.
const (
	maxQueuedCalls = 10000
	maxQueuedBytes = 256 << 20
)

// beatCheckInterval is how often waiting calls are checked for a heartbeat
// that is due; each still gets one protocol.HeartbeatInterval after the last.
const beatCheckInterval = time.Second

// callQueue is a FIFO of waiting calls. A call cancelled while waiting
// leaves (its state moves on) and is skipped when its turn comes, so a
// cancel costs O(1) however long the queue is. Guarded by callBook.mu: the
// moves it makes (into waiting, and out of it to vetting or leaving) are
// the book's.
type callQueue struct {
	waiting []*call // waiting[head:] in arrival order; some may have left
	head    int
	n       int   // calls still waiting
	bytes   int64 // their requests' size
}

// fits reports whether one more call of size bytes may wait.
func (q *callQueue) fits(size int) bool {
	return q.n < maxQueuedCalls && q.bytes+int64(size) <= maxQueuedBytes
}

// fullError is the answer to a call beyond the bound: it names the limit.
func (q *callQueue) fullError(parallel int) string {
	return fmt.Sprintf("this worker's queue is full: %d calls (%s of requests) are already waiting for one of its --parallel %d slots, "+
		"and at most %d calls or %s may wait; this call was not started: send at most max_parallel calls at a time, or raise --parallel",
		q.n, logging.FormatBytes(q.bytes), parallel, maxQueuedCalls, logging.FormatBytes(maxQueuedBytes))
}

func (q *callQueue) push(c *call) {
	c.move(callWaiting)
	q.waiting = append(q.waiting, c)
	q.n++
	q.bytes += int64(c.size)
}

// pop takes the next waiting call, or nil; it now holds a slot, vetting.
func (q *callQueue) pop() *call {
	for q.head < len(q.waiting) {
		c := q.waiting[q.head]
		q.waiting[q.head] = nil
		q.head++
		if c.state == callWaiting {
			q.leave(c, callVetting)
			q.compact()
			return c
		}
	}
	q.compact()
	return nil
}

// remove takes c out of the queue wherever it is (a cancel): it is
// leaving. It reports false when c was not waiting.
func (q *callQueue) remove(c *call) bool {
	if c.state != callWaiting {
		return false
	}
	q.leave(c, callLeaving)
	return true
}

// leave counts c out of the queue, moving it to.
func (q *callQueue) leave(c *call, to callState) {
	c.move(to)
	q.n--
	q.bytes -= int64(c.size)
}

// takeAll empties the queue and returns the calls that were waiting, each
// leaving.
func (q *callQueue) takeAll() []*call {
	var out []*call
	for _, c := range q.waiting[q.head:] {
		if c.state == callWaiting {
			q.leave(c, callLeaving)
			out = append(out, c)
		}
	}
	*q = callQueue{}
	return out
}

// appendWaiting appends the calls still waiting to buf.
func (q *callQueue) appendWaiting(buf []*call) []*call {
	for _, c := range q.waiting[q.head:] {
		if c.state == callWaiting {
			buf = append(buf, c)
		}
	}
	return buf
}

// compact drops the consumed front of the slice once it is most of it, so
// a long-lived queue does not keep every call it ever held.
func (q *callQueue) compact() {
	if q.head == len(q.waiting) {
		q.waiting, q.head = q.waiting[:0], 0
		return
	}
	if q.head > 1024 && q.head > len(q.waiting)/2 {
		q.waiting = append(q.waiting[:0:0], q.waiting[q.head:]...)
		q.head = 0
	}
}

// runSlot holds one of the --parallel runner slots: it runs c, then each
// waiting call in turn, and gives the slot back when none is left. A slot
// is taken by the next call only once the previous call's processes are
// gone (its runner exited, its cgroup or process group empty), so there
// are never more than --parallel calls' processes. The previous call's
// end record follows once its runner's exit is reported (call.settle),
// off the slot.
//
// Each call is vetted in the slot first (vet: its pre-call hook), so at
// most --parallel pre-call hooks run at once; a call its hook declines
// ends there, and the slot takes the next.
func (a *Agent) runSlot(c *call) {
	for c != nil {
		if a.vet(c) {
			c.run(c.session, c.rt)
			if a.cfg.PostCallHook != "" {
				c.settled() // the hook is told what the call cost
			}
			a.afterCall(c) // the post-call hook, in the slot and within its bound
		}
		if c.journal != nil {
			// The call is over: nothing of it can be asked for again.
			c.journal.Close()
		}
		done := c
		// A stopping worker answers the waiting calls itself (stopAll); a
		// lost connection drops them (dropWaiting). Neither starts them.
		// A slot whose call could outlive its connection (resume.go)
		// serves the calls of the connection there is now.
		connected := done.journal != nil || done.session.Err() == nil
		var running, waiting int
		c, running, waiting = a.book.next(done, connected && !a.life.mode().ending())
		// done's end record may wait for its runner's exit to be reported:
		// the next call does not.
		finished := func() {
			done.settled()
			done.wg.Done()
		}
		if c == nil {
			finished()
		} else {
			c.wg.Add(1)
			go finished()
			a.publishCounts(running, waiting)
			c.log.Info("call started after waiting for a slot", "op", c.op, "function", logging.Cut(c.function, maxLoggedID),
				"waited", time.Since(c.arrived).Round(time.Millisecond).String())
		}
	}
}

// beatWaiting sends each call that waits, for a slot or on its pre-call
// hook, its heartbeats, as a running call gets them from supervise, until
// the connection ends. Which calls those are is the book's to say.
func (a *Agent) beatWaiting(at *attachment) {
	defer at.calls.Done()
	tick := time.NewTicker(beatCheckInterval)
	defer tick.Stop()
	var waiting []*call
	for {
		select {
		case <-at.ctx.Done():
			return
		case now := <-tick.C:
			waiting = a.book.appendAwaiting(waiting[:0])
			for _, c := range waiting {
				c.beatIfDue(now)
			}
			clear(waiting)
		}
	}
}

// answerWaiting answers every waiting call with reason, without starting
// any: the worker is stopping.
func (a *Agent) answerWaiting(reason string) {
	waiting := a.book.takeWaiting()
	if len(waiting) > 0 {
		a.log.Info("answering the calls waiting for a slot; none of them started", "calls", len(waiting), "reason", reason)
	}
	for _, c := range waiting {
		c.answerError(protocol.TypeNodeCancelled, reason)
		a.callEnded(c)
	}
}

// dropWaiting forgets the waiting calls of a connection that is gone:
// nobody can hear their answers, and the engine reschedules them.
func (a *Agent) dropWaiting() {
	waiting, running := a.book.dropWaiting()
	if len(waiting) > 0 {
		a.log.Warn("calls waiting for a slot were dropped with the connection; the engine reschedules them", "calls", len(waiting))
		a.publishCounts(running, 0)
	}
}
