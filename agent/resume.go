package agent

// Calls that survive an outage: the resume extension (docs/resume.md). On a
// connection whose welcome accepted it, each call's frames go through a
// hold.Journal. When the connection is lost, its running calls are held:
// they keep running for the grace, their output kept. On the next accepting
// welcome the worker says which calls it holds and how far each got; the
// engine answers per call continue (replayed after its last frame, then
// live) or cancel; a call it does not claim, a call past the grace, and
// every held call when the next engine does not accept the extension are
// stopped as a lost connection stops them, their kept output dropped.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fluksio/fluksio-worker/agent/hold"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// What one call's journal may keep: the frames it sent until the engine
// says it has them (they may still be in the worker's queue or either
// socket's buffers, tens of MiB, when the connection dies) and, while
// held, the frames it produces. Memory: a few MiB per call, so --parallel
// calls cost tens of MiB at most; the rest spills to the state directory.
// Disk: 1 GiB per call bounds what an outage can write (a held call with
// more output pauses: its runner waits on its pipe until the engine is
// back); past it, the oldest frames already sent go first. All calls'
// spill files together stay within --held-disk-max, past which a held
// call pauses the same way.
var holdLimits = hold.Limits{Memory: 4 << 20, Disk: 1 << 30}

// resumeAnswerTimeout bounds the wait for the engine's resume answer, as
// the welcome's wait is bounded: held calls are then unclaimed.
const resumeAnswerTimeout = 30 * time.Second

// Reasons a held call is stopped.
const (
	msgOutageGrace   = "the connection to the engine was lost for longer than --outage-grace"
	msgUnclaimed     = "the engine did not claim the call on reconnection"
	msgNoResume      = "the engine did not accept the resume extension on reconnection"
	msgNoAnswer      = "the engine did not answer the worker's resume message"
	msgCannotReplay  = "the call's events cannot be replayed from where the engine asks"
	msgCancelledHeld = "the engine cancelled the call while it was held through an outage"
)

// heldRetryMax bounds the wait between attempts to attach while calls are
// held, whatever their grace: an engine back is found within seconds.
const heldRetryMax = 5 * time.Second

// heldRetryLimit is the longest wait before the next attempt to attach
// while calls are held (0 when none is): a tenth of the shortest grace, at
// most heldRetryMax, so that an engine back within the grace finds its calls
// still held rather than a worker asleep in a 30 s backoff.
func (a *Agent) heldRetryLimit() time.Duration {
	var limit time.Duration
	for _, c := range a.book.held() {
		if l := min(c.grace/10, heldRetryMax); limit == 0 || l < limit {
			limit = l
		}
	}
	return limit
}

// heldDir is where held calls spill their output.
func (a *Agent) heldDir() string { return filepath.Join(a.stateDir, "held") }

// removeStaleSpills deletes spill files a previous worker process left
// (it crashed or was killed while holding calls): nothing is kept across
// processes. A spill file still in use elsewhere is read through its open
// descriptor, so its path going away does not disturb its owner.
func (a *Agent) removeStaleSpills() {
	stale, _ := filepath.Glob(filepath.Join(a.heldDir(), "call-*.spill"))
	for _, f := range stale {
		os.Remove(f)
	}
	if len(stale) > 0 {
		a.log.Info("removed output a previous worker process kept for calls that died with it", "files", len(stale))
	}
}

// holdCalls holds every running call that has a journal: the connection
// is gone. Each is stopped when its grace runs out unless an engine claims
// it first.
func (a *Agent) holdCalls() {
	held := a.book.hold(func(c *call) { a.stopHeld(c, msgOutageGrace) })
	if len(held) == 0 {
		return
	}
	for _, c := range held {
		c.log.Warn("call held: it keeps running through the outage, its output kept for the engine",
			"grace", c.grace.String(), "stopped_at", c.since.Add(c.grace).UTC().Format(time.RFC3339))
	}
	a.publishHeld()
}

// stopHeld stops a held call as a lost connection stops a call: nothing is
// sent, and its kept output is dropped.
func (a *Agent) stopHeld(c *call, reason string) {
	since, ok := a.book.unhold(c)
	if !ok {
		return
	}
	c.log.Warn("held call stopped; its kept output is dropped", "reason", reason,
		"held_for", time.Since(since).Round(time.Millisecond).String())
	c.journal.Close()
	c.release()
	a.metrics.HeldEnded(metrics.HeldStopped)
	a.publishHeld()
}

// stopAllHeld stops every held call with reason.
func (a *Agent) stopAllHeld(reason string) {
	for _, c := range a.book.held() {
		a.stopHeld(c.call, reason)
	}
}

// abandonAll is the worker's end: every call that could outlive its
// connection is stopped, held or not (one caught between connections by a
// second signal), and nothing it kept waits for an engine any more.
func (a *Agent) abandonAll(reason string) {
	a.stopAllHeld(reason)
	var left []*call
	a.book.each(func(c *call) {
		if c.journal != nil {
			left = append(left, c)
		}
	})
	for _, c := range left {
		c.journal.Close()
		c.release()
	}
}

// offerHeld starts a connection whose welcome accepted the extension: it
// tells the engine which calls this worker holds and how far each got, and
// stops them all if no answer comes.
func (a *Agent) offerHeld(at *attachment) {
	held := a.book.held()
	msg := protocol.ResumeHello{Op: protocol.OpResume, Calls: make([]protocol.HeldCall, 0, len(held))}
	for _, c := range held {
		st := c.journal.Stats()
		msg.Calls = append(msg.Calls, protocol.HeldCall{CallID: c.id, Seq: st.Seq, Done: st.Answered,
			HeldFor: time.Since(c.since).Seconds()})
	}
	at.conn.SendJSON(msg)
	if len(held) > 0 {
		a.log.Info("told the engine which calls this worker holds", "calls", len(held))
	}
	at.resumeTimer = time.AfterFunc(a.resumeWait, func() {
		if at.ctx.Err() == nil && at.resumed.CompareAndSwap(false, true) {
			a.log.Warn("the engine did not answer the resume message in time; held calls are stopped", "timeout", a.resumeWait.String())
			for _, c := range held {
				a.stopHeld(c.call, msgNoAnswer)
			}
		}
	})
}

// resumeAnswered acts on the engine's answer to the resume message: each
// held call continues, is cancelled, or (unclaimed) is stopped.
func (a *Agent) resumeAnswered(at *attachment, m protocol.Message) {
	if at.conn.ResumeGrace() == 0 || !at.resumed.CompareAndSwap(false, true) {
		if at.noise.Allow() {
			a.log.Warn("ignoring a resume message the worker did not ask for")
		}
		return
	}
	at.resumeTimer.Stop()
	verdicts, err := protocol.ParseResumeAnswer(m.Fields)
	if err != nil {
		a.log.Warn("the engine's resume answer is not understood; held calls are stopped", "error", err)
	}
	for _, c := range a.book.held() {
		v, ok := verdicts[c.id]
		switch {
		case !ok:
			a.stopHeld(c.call, msgUnclaimed)
		case v.Action == protocol.ResumeCancel:
			a.cancelHeld(at, c.call)
		default:
			a.continueHeld(at, c.call, v.Seq)
		}
	}
	a.publishHeld()
}

// continueHeld replays c after the engine's last frame, then it goes on live.
func (a *Agent) continueHeld(at *attachment, c *call, after int64) {
	since, ok := a.book.unhold(c)
	if !ok {
		return
	}
	heldFor := time.Since(since).Round(time.Millisecond)
	seq := c.journal.Stats().Seq
	c.journal.SetAck(at.conn.ResumeAck())
	a.metrics.HeldEnded(metrics.HeldResumed)
	at.calls.Add(1)
	go func() {
		defer at.calls.Done()
		err := c.journal.Replay(at.conn, after)
		switch {
		case err == nil:
			c.log.Info("held call resumed: its kept events were replayed", "held_for", heldFor.String(),
				"engine_had", after, "replayed", seq-after)
		case errors.Is(err, hold.ErrLost):
			// The connection went too; the session holds the call again.
		default:
			c.log.Error("held call cannot resume; it is stopped", "error", err)
			if c.journal.Discard(at.conn) {
				c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, protocol.TypeRemoteError, msgCannotReplay+": "+err.Error()))
				return
			}
			c.stopAnswering(msgCannotReplay + ": " + err.Error())
		}
	}()
}

// cancelHeld stops c for the engine, which cancelled it: its kept output is
// dropped, and the answer is a cancel.
func (a *Agent) cancelHeld(at *attachment, c *call) {
	if _, ok := a.book.unhold(c); !ok {
		return
	}
	a.metrics.HeldEnded(metrics.HeldCancelled)
	c.log.Info("the engine cancelled a held call; its kept output is dropped")
	c.journal.SetAck(at.conn.ResumeAck())
	if c.journal.Discard(at.conn) {
		// It had answered while held; that answer is gone with the rest.
		c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, protocol.TypeNodeCancelled, msgCancelledHeld))
		return
	}
	c.stop(msgCancelledHeld)
}

// acked is the engine's acknowledgement of a call's answer: the call is
// over for the worker once it is. One for a call it does not hold, or
// before the answer went out, is ignored.
func (a *Agent) acked(at *attachment, id string) {
	c := a.book.lookup(id)
	if c != nil && c.journal != nil && at.conn.ResumeAck() && c.journal.Ack() {
		return
	}
	if at.noise.Allow() {
		a.log.Info("ignoring an acknowledgement of no answer this worker waits on", "call_id", logging.Cut(id, maxLoggedID))
	}
}

// publishHeld shows the held calls in the status file and the metrics.
func (a *Agent) publishHeld() {
	held := a.book.held()
	var mem, disk int64
	var h *status.Held
	for _, c := range held {
		st := c.journal.Stats()
		mem += st.Memory
		disk += st.Disk
		if h == nil {
			h = &status.Held{Since: c.since, Deadline: c.since.Add(c.grace)}
		}
		h.Calls = append(h.Calls, logging.Cut(c.id, maxLoggedID))
		h.Since = minTime(h.Since, c.since)
		h.Deadline = minTime(h.Deadline, c.since.Add(c.grace))
	}
	if h != nil {
		slices.Sort(h.Calls)
		h.Memory, h.Disk = mem, disk
	}
	var oldest time.Duration
	if h != nil {
		oldest = time.Since(h.Since)
	}
	a.metrics.SetHeld(len(held), oldest, mem, disk)
	a.status.Update(func(s *status.Status) { s.Held = h })
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// watchHeld refreshes what status and metrics say of held calls (their
// output grows while held) until ctx ends.
func (a *Agent) watchHeld(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if len(a.book.held()) > 0 {
				a.publishHeld()
			}
		}
	}
}
