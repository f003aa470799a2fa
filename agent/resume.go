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

// What one held call may keep. Memory: a few MiB per call, so --parallel
// calls held at once cost tens of MiB at most; the rest spills to the state
// directory. Disk: 1 GiB per call bounds what an outage can write (a call
// with more output pauses: its runner waits on its pipe until the engine is
// back); all held calls together spill at most --held-disk-max, past which
// they pause the same way. Retain: frames already written to a connection
// that dies may not have reached the engine: the socket's send buffer, a
// few MiB at most, holds that much.
var holdLimits = hold.Limits{Memory: 4 << 20, Disk: 1 << 30, Retain: 4 << 20}

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

// adopt makes c a call of at: on a connection that accepted the extension
// its frames go through a journal and it outlives the connection; on any
// other, it is the connection's and stops with it.
func (at *attachment) adopt(a *Agent, c *call) {
	c.rt = at.rt
	c.wg = at.calls
	c.session = at.ctx
	if grace := at.conn.ResumeGrace(); grace > 0 {
		c.grace = grace
		lim := holdLimits
		lim.Shared = a.heldDisk
		c.journal = hold.New(at.conn, a.heldDir(), lim)
		c.session, c.release = context.WithCancel(context.Background())
		c.wg = &a.outliving
	}
}

// abandon lets go of what adopt made for a call that is refused.
func (c *call) abandon() {
	if c.release != nil {
		c.release()
	}
}

// holdCalls holds every running call that has a journal: the connection
// is gone. Each is stopped when its grace runs out unless an engine claims
// it first.
func (a *Agent) holdCalls() {
	var held []*call
	a.book.each(func(c *call) {
		if c.journal == nil || c.queued || c.holdTimer != nil {
			return
		}
		c.journal.Detach()
		c.heldAt = time.Now()
		c.holdTimer = time.AfterFunc(c.grace, func() { a.stopHeld(c, msgOutageGrace) })
		held = append(held, c)
	})
	if len(held) == 0 {
		return
	}
	for _, c := range held {
		c.log.Warn("call held: it keeps running through the outage, its output kept for the engine",
			"grace", c.grace.String(), "stopped_at", c.heldAt.Add(c.grace).UTC().Format(time.RFC3339))
	}
	a.publishHeld()
}

// heldCalls are the calls held now.
func (a *Agent) heldCalls() []*call {
	var held []*call
	a.book.each(func(c *call) {
		if c.holdTimer != nil {
			held = append(held, c)
		}
	})
	return held
}

// release ends c's hold: it reports false when it was not held (any more).
func (a *Agent) unhold(c *call) bool {
	held := false
	a.book.locked(func() {
		if held = c.holdTimer != nil; held {
			c.holdTimer.Stop()
			c.holdTimer = nil
		}
	})
	return held
}

// stopHeld stops a held call as a lost connection stops a call: nothing is
// sent, and its kept output is dropped.
func (a *Agent) stopHeld(c *call, reason string) {
	if !a.unhold(c) {
		return
	}
	c.log.Warn("held call stopped; its kept output is dropped", "reason", reason,
		"held_for", time.Since(c.heldAt).Round(time.Millisecond).String())
	c.journal.Close()
	c.release()
	a.metrics.HeldEnded(metrics.HeldStopped)
	a.publishHeld()
}

// stopAllHeld stops every held call with reason.
func (a *Agent) stopAllHeld(reason string) {
	for _, c := range a.heldCalls() {
		a.stopHeld(c, reason)
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
	held := a.heldCalls()
	msg := protocol.ResumeHello{Op: protocol.OpResume, Calls: make([]protocol.HeldCall, 0, len(held))}
	for _, c := range held {
		st := c.journal.Stats()
		msg.Calls = append(msg.Calls, protocol.HeldCall{CallID: c.id, Seq: st.Seq, Done: st.Answered,
			HeldFor: time.Since(c.heldAt).Seconds()})
	}
	at.conn.SendJSON(msg)
	if len(held) > 0 {
		a.log.Info("told the engine which calls this worker holds", "calls", len(held))
	}
	at.resumeTimer = time.AfterFunc(a.resumeWait, func() {
		if at.ctx.Err() == nil && at.resumed.CompareAndSwap(false, true) {
			a.log.Warn("the engine did not answer the resume message in time; held calls are stopped", "timeout", a.resumeWait.String())
			for _, c := range held {
				a.stopHeld(c, msgNoAnswer)
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
	for _, c := range a.heldCalls() {
		v, ok := verdicts[c.id]
		switch {
		case !ok:
			a.stopHeld(c, msgUnclaimed)
		case v.Action == protocol.ResumeCancel:
			a.cancelHeld(at, c)
		default:
			a.continueHeld(at, c, v.Seq)
		}
	}
	a.publishHeld()
}

// continueHeld replays c after the engine's last frame, then it goes on live.
func (a *Agent) continueHeld(at *attachment, c *call, after int64) {
	if !a.unhold(c) {
		return
	}
	heldFor := time.Since(c.heldAt).Round(time.Millisecond)
	seq := c.journal.Stats().Seq
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
			c.stop(msgCannotReplay + ": " + err.Error())
		}
	}()
}

// cancelHeld stops c for the engine, which cancelled it: its kept output is
// dropped, and the answer is a cancel.
func (a *Agent) cancelHeld(at *attachment, c *call) {
	if !a.unhold(c) {
		return
	}
	a.metrics.HeldEnded(metrics.HeldCancelled)
	c.log.Info("the engine cancelled a held call; its kept output is dropped")
	if c.journal.Discard(at.conn) {
		// It had answered while held; that answer is gone with the rest.
		c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, protocol.TypeNodeCancelled, msgCancelledHeld))
		return
	}
	c.stop(msgCancelledHeld)
}

// publishHeld shows the held calls in the status file and the metrics.
func (a *Agent) publishHeld() {
	held := a.heldCalls()
	var mem, disk int64
	var h *status.Held
	for _, c := range held {
		st := c.journal.Stats()
		mem += st.Memory
		disk += st.Disk
		if h == nil {
			h = &status.Held{Since: c.heldAt, Deadline: c.heldAt.Add(c.grace)}
		}
		h.Calls = append(h.Calls, logging.Cut(c.id, maxLoggedID))
		h.Since = minTime(h.Since, c.heldAt)
		h.Deadline = minTime(h.Deadline, c.heldAt.Add(c.grace))
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
			if len(a.heldCalls()) > 0 {
				a.publishHeld()
			}
		}
	}
}
