package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluksio/fluksio-worker/agent/engine"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/hold"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner"
)

// A call is one run or compile request as the engine sees it: its id and
// op, where it is in its life (state, the book's), its heartbeats and its
// answer (the runner's, or the worker's own). Its runner process is a
// runner.Process, which starts and stops it; the call's goroutine is the
// one that ends it.
type call struct {
	id       string
	idJSON   []byte   // id as a JSON string, which every line the call sends carries
	op       string   // run or compile
	function string   // the request's function, for the log
	request  []byte   // the request line, without its env; dropped once written
	size     int      // the request's size, for the queue's bound
	env      []string // the request's env, added to the agent's own
	host     callHost
	conn     *engine.Conn
	log      *slog.Logger
	arrived  time.Time

	// ctx is the call's, from its arrival: stop cancels it with a
	// *runner.StopError, which stops its runner, started or not yet.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// state is where it is in its life (callstate.go); guarded by
	// callBook.mu, changed only by the book.
	state callState

	// preCall is what its pre-call hook reads on stdin (nil without a
	// hook), and refuse answers it declined without running (dispatch.go):
	// both for vet, in its slot.
	preCall []byte
	refuse  func(*refusal)

	// sendMu orders what the call sends: heartbeats come from beatWaiting
	// while it waits (for a slot or on its pre-call hook) and from
	// supervise once it runs, and none may follow the answer.
	sendMu   sync.Mutex
	answered bool
	lastBeat time.Time // the last heartbeat, or the arrival

	proc atomic.Pointer[runner.Process] // once started, for kill

	// Set by attachment.adopt before the call runs (resume.go).
	rt       runner.Runtime     // the runner script of the call's connection
	attached context.Context    // ends with the connection the call came on
	session  context.Context    // ends when nobody can hear the call any more
	wg       *sync.WaitGroup    // counts the goroutine serving the call
	journal  *hold.Journal      // numbers and keeps its frames; nil without the resume extension
	grace    time.Duration      // how long it may be held through an outage
	release  context.CancelFunc // ends session, for a held call
	// Guarded by callBook.mu, and changed only by its hold, unhold and
	// end: while held, the timer that stops it at the end of its grace, and
	// when the hold began.
	holdTimer *time.Timer
	heldAt    time.Time

	// Set by the call's own goroutine (or, for a call that never ran, by
	// the one that answers it), read by callEnded and logEnd on it; the
	// end's fields only through setEnd.
	begun   time.Time // when run began
	outcome string    // metrics.OutcomeOK, OutcomeError or OutcomeCancelled
	// A failed or cancelled call's error type and short message, for its
	// end record.
	errType, errMsg string
	// lost: the call was stopped because the connection to the engine
	// was lost; nobody heard its answer.
	lost bool
	// usage is what its runner cost, once its processes are gone; nil
	// when none was started. It is set by settle, which waits for the
	// runner's exit to be reported where End returned before that
	// (runner.Process.End), and logs the call's end record then.
	usage  *runner.Usage
	settle func()
}

// maxLoggedID bounds an identifier (a call_id, an op, a function) in the
// log: the engine chooses them, and a 1 MB call_id must not be logged
// whole on every line of its call.
const maxLoggedID = 128

// callHost is what a call uses of the worker, and all it uses.
type callHost struct {
	metrics *metrics.Metrics // nil without --listen
	runners *runner.Pool     // starts its runner
	ended   func(*call)      // counts its end, once (Agent.callEnded)
}

// newCall makes a call of an engine's request; it runs once it has a slot.
func newCall(id, op, function string, request []byte, env []string, host callHost, conn *engine.Conn, log *slog.Logger, now time.Time) *call {
	c := &call{id: id, idJSON: protocol.EncodeCallID(id), op: op, function: function, request: request, size: len(request) + envSize(env), env: env,
		host: host, conn: conn, log: log, arrived: now, lastBeat: now}
	// Not a child of the connection's context: a waiting call must not
	// hold on to it; run stops the call when the connection is lost.
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	return c
}

// envSize is what the request's env adds to its size.
func envSize(env []string) int {
	n := 0
	for _, kv := range env {
		n += len(kv)
	}
	return n
}

// Error answers the agent itself sends.
const (
	msgStopping = "the worker is stopping"
	// msgConnectionLost says why a call the worker stopped with its
	// connection ended; nobody hears its answer.
	msgConnectionLost = "the connection to the engine was lost"
	msgDraining       = "the worker is draining"
	// msgCancelledWaiting answers a cancel of a call that was still
	// waiting for a slot: nothing of it ever ran.
	msgCancelledWaiting = "the call was cancelled before it started"
	// msgNotCancelled replaces a runner's NodeCancelled that no cancel
	// or stop of the worker's caused: the runtime answers that way to any
	// SIGTERM, and numba raises one in a process that forks after using
	// its OpenMP layer.
	msgNotCancelled = "the node process got a SIGTERM that the worker did not send (nobody cancelled the call): the node's code, a library it uses (numba raises one when a process that used its OpenMP threads forks) or another process of this user sent it; see the node's stderr"
)

// run executes the call to its end. It returns only when no process of
// its runner is left; what it cost, and so its end record, may follow
// (settle).
func (c *call) run(ctx context.Context, rt runner.Runtime) {
	c.begun = time.Now()
	c.host.metrics.CallStarted(c.op)
	// The connection is gone: nobody can hear the answer, and the engine
	// reschedules the call. Stop it now.
	lost := context.AfterFunc(ctx, func() { c.stop(msgConnectionLost) })
	defer lost()
	request := c.request
	c.request = nil // a request of many MiB is not kept for the call's life
	p, err := c.host.runners.Start(c.ctx, runner.Spec{
		CallID:  c.id,
		Runtime: rt,
		Env:     c.env,
		Request: request,
		Log:     c.log,
		Send:    func(frame []byte) { c.sendEvent(c.own(frame)) },
	})
	request = nil
	if err != nil {
		c.notStarted(ctx, err)
		c.host.ended(c)
		return
	}
	c.proc.Store(p)
	end := c.supervise(ctx, p)
	var usage func() runner.Usage
	ended := false
	if !c.delivered() {
		// Answered while held: the runner goes now, the answer waits for
		// the engine to come back (or the hold to end).
		usage, ended = p.End(end.Answer != nil), true
		c.awaitDelivery()
	}
	c.host.ended(c)
	// The call is over for the engine; now nothing of it may remain.
	if !ended {
		usage = p.End(end.Answer != nil)
	}
	c.settle = sync.OnceFunc(func() {
		u := usage()
		c.logEnd(&u)
		c.usage = &u
	})
	// The socket's writer gave back what it could once it sent the
	// answer; the answer itself was held here until now. (An outsized
	// request's memory went back once the runner read it.)
	if len(end.Answer) >= frame.Outsized {
		end.Answer = nil
		frame.Release()
	}
}

// supervise waits for the call's output to end while sending heartbeats,
// and sends the answer (the runner's or the agent's own). Only this
// goroutine sends heartbeats and the answer, so nothing of the call
// follows its answer.
func (c *call) supervise(ctx context.Context, p *runner.Process) runner.Output {
	// The first heartbeat is due protocol.HeartbeatInterval after the last one the
	// call got while it waited in the queue (or after it arrived).
	beat := time.NewTimer(time.Until(c.nextBeat()))
	defer beat.Stop()
	for {
		select {
		case end := <-p.Output():
			c.answer(ctx, p, end)
			return end
		case <-beat.C:
			c.beatIfDue(time.Now())
			beat.Reset(time.Until(c.nextBeat()))
		}
	}
}

// answer sends the call's answer: the runner's, or the agent's own when the
// output ended without one.
func (c *call) answer(ctx context.Context, p *runner.Process, end runner.Output) {
	if ctx.Err() != nil {
		// The connection is gone and nobody hears an answer; the worker
		// stopped the call, so it counts as cancelled.
		c.endLost()
		return
	}
	var own ownAnswer
	switch {
	case errors.As(context.Cause(c.ctx), &own):
		// Whatever the runner answered to the stop ("the call was
		// cancelled" says the engine asked), the engine must hear why.
		c.answerError(protocol.TypeNodeCancelled, own.stop.Error())
	case end.Answer != nil && runner.Stopped(c.ctx) == nil && protocol.ReadOutcome(end.Answer) == protocol.Cancelled:
		// Only a cancel is a cancel.
		frame.Put(end.Answer)
		c.answerError(protocol.TypeRemoteError, msgNotCancelled)
	case end.Answer != nil:
		outcome, typ, msg := answerOutcome(end.Answer), "", ""
		if outcome != metrics.OutcomeOK {
			typ, msg = protocol.ReadError(end.Answer)
		}
		c.setEnd(outcome, typ, msg, false)
		c.host.metrics.AnswerRelayed(len(end.Answer))
		c.sendAnswer(c.own(end.Answer))
	case end.Err != nil:
		c.answerError(protocol.TypeRemoteError, end.Err.Error())
	default:
		if stop := runner.Stopped(c.ctx); stop != nil {
			c.answerError(protocol.TypeNodeCancelled, stop.Error())
		} else {
			c.answerError(protocol.TypeRemoteError, p.DeathMessage())
		}
	}
}

// setEnd records how the call ended, for its end record and the metrics:
// the one place its outcome, error and loss are set. lost: the connection
// to the engine was lost and nobody heard an answer.
func (c *call) setEnd(outcome, errType, errMsg string, lost bool) {
	c.outcome, c.errType, c.errMsg, c.lost = outcome, errType, errMsg, lost
}

// answerError ends the call with the worker's own error answer: cancelled
// when typ is NodeCancelled, failed otherwise.
func (c *call) answerError(typ, msg string) {
	outcome := metrics.OutcomeError
	if typ == protocol.TypeNodeCancelled {
		outcome = metrics.OutcomeCancelled
	}
	c.setEnd(outcome, typ, msg, false)
	c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, typ, msg))
}

// endLost ends a call stopped because its connection was lost: nobody
// hears its answer, and it counts as cancelled.
func (c *call) endLost() {
	c.setEnd(metrics.OutcomeCancelled, protocol.TypeNodeCancelled, msgConnectionLost, true)
}

// answerOutcome is the metrics label of how a runner's answer ended.
func answerOutcome(answer []byte) string {
	switch protocol.ReadOutcome(answer) {
	case protocol.Succeeded:
		return metrics.OutcomeOK
	case protocol.Cancelled:
		return metrics.OutcomeCancelled
	}
	return metrics.OutcomeError
}

// own makes a runner's line its call's, whatever call_id the runner wrote
// (protocol.StampCallID); a frame it replaces goes back to the pool.
func (c *call) own(line []byte) []byte {
	stamped := protocol.StampCallID(line, c.idJSON)
	if len(stamped) != len(line) || &stamped[0] != &line[0] {
		frame.Put(line)
	}
	return stamped
}

// nextBeat is when the call's next heartbeat is due.
func (c *call) nextBeat() time.Time {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.lastBeat.Add(protocol.HeartbeatInterval)
}

// beatIfDue sends a heartbeat if none went out for protocol.HeartbeatInterval and
// the call is not answered yet.
func (c *call) beatIfDue(now time.Time) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.answered || now.Before(c.lastBeat.Add(protocol.HeartbeatInterval)) {
		return
	}
	c.lastBeat = now
	if c.journal == nil {
		c.conn.SendJSON(protocol.NewHeartbeat(c.id))
	} else if live := c.journal.Live(); live != nil {
		// Heartbeats are not kept: one sent while held would say nothing.
		b, _ := json.Marshal(protocol.NewHeartbeat(c.id))
		live.Send(b)
	} else {
		return
	}
	c.host.metrics.HeartbeatSent()
}

// sendEvent sends one of the runner's event lines.
func (c *call) sendEvent(frame []byte) {
	if c.journal != nil {
		c.journal.Append(frame, false)
		return
	}
	c.conn.Send(frame)
}

// sendAnswer sends the call's answer frame; nothing of the call follows.
func (c *call) sendAnswer(frame []byte) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.answered = true
	if c.journal != nil {
		c.journal.Append(frame, true)
		return
	}
	c.conn.Send(frame)
}

// delivered says whether the call's answer reached a connection (always,
// without a journal: what cannot be held is sent or lost at once).
func (c *call) delivered() bool {
	if c.journal == nil {
		return true
	}
	select {
	case <-c.journal.Delivered():
		return true
	default:
		return false
	}
}

// awaitDelivery waits until the call's answer is delivered: sent to the
// engine, and acknowledged where the engine acknowledges answers. An answer
// the live connection's engine has not acknowledged within the call's grace
// is let go, as if it had been; while the call is held, its hold's end
// decides.
func (c *call) awaitDelivery() {
	wait := time.NewTimer(c.grace)
	defer wait.Stop()
	for {
		select {
		case <-c.journal.Delivered():
			return
		case <-wait.C:
			if c.journal.Ack() {
				c.log.Warn("the engine did not acknowledge the call's answer within the grace; the call is over", "grace", c.grace.String())
				return
			}
			wait.Reset(c.grace)
		}
	}
}

// markAnswered says the call's answer is being sent outside it (a call
// vet declined, answered through its refuse): no heartbeat may follow.
func (c *call) markAnswered() {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.answered = true
}

// wasAnswered says whether the engine was sent the call's answer.
func (c *call) wasAnswered() bool {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.answered
}

func (c *call) sendAnswerJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	c.sendAnswer(b)
}

// settled waits for what the call's runner cost and logs its end record,
// once; a call whose runner never started has neither.
func (c *call) settled() {
	if c.settle != nil {
		c.settle()
	}
}

// notStarted answers a call whose runner did not start: it was stopped
// before (between leaving the queue and starting; nothing of it ran), or
// its process could not be started.
func (c *call) notStarted(ctx context.Context, err error) {
	var stop *runner.StopError
	switch {
	case !errors.As(err, &stop):
		c.setEnd(metrics.OutcomeError, protocol.TypeRemoteError, "the call could not start: "+err.Error(), false)
		c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, protocol.TypeRemoteError, err.Error()))
	case ctx.Err() != nil: // nobody hears an answer
		c.endLost()
	default:
		c.answerError(protocol.TypeNodeCancelled, stop.Error())
	}
}

// stop stops the call's runner: SIGTERM to everything of it, then SIGKILL
// after --cancel-grace (runner.Process runs the ladder). reason is the
// answer's message if the runner does not answer by itself; "" keeps the
// protocol's "the node process stopped". Only the first stop counts.
func (c *call) stop(reason string) {
	c.cancel(&runner.StopError{Reason: reason})
}

// stopAnswering stops the call as stop does, and answers it NodeCancelled
// with reason whatever the runner answers: the worker stopped it on its own
// account, and the engine is to hear why.
func (c *call) stopAnswering(reason string) {
	c.cancel(ownAnswer{&runner.StopError{Reason: reason}})
}

// ownAnswer is the cause of a stop whose answer is the worker's own.
type ownAnswer struct{ stop *runner.StopError }

func (o ownAnswer) Error() string { return o.stop.Error() }
func (o ownAnswer) Unwrap() error { return o.stop }

// kill stops the runner's processes at once, for a worker told twice to
// stop.
func (c *call) kill() {
	if p := c.proc.Load(); p != nil {
		p.Kill()
	}
}

// maxLoggedError bounds an error message in a call's end record: its
// first words say what failed; the engine has the whole traceback.
const maxLoggedError = 300

// logEnd writes the call's one end record: what it ran, how it ended, how
// long it ran and, when its runner was started, what it cost (u, nil
// otherwise). A failed call is a warning, so --log-level warn shows it; so
// is a call stopped by a lost connection, which the engine reschedules.
// Dashboards and log pipelines parse these fields: keep their names.
func (c *call) logEnd(u *runner.Usage) {
	since := c.begun
	if since.IsZero() {
		since = c.arrived // never got a slot
	}
	attrs := []slog.Attr{
		slog.String("op", c.op),
		slog.String("function", logging.Cut(c.function, maxLoggedID)),
		slog.String("outcome", c.outcome),
		slog.Int64("duration_ms", time.Since(since).Milliseconds()),
	}
	if c.outcome != metrics.OutcomeOK {
		attrs = append(attrs, slog.String("error_type", logging.Cut(c.errType, maxLoggedID)),
			slog.String("error", logging.Cut(c.errMsg, maxLoggedError)))
	}
	if u != nil {
		attrs = append(attrs, slog.Int64("cpu_ms", u.CPU.Milliseconds()), slog.Int64("peak_rss_mb", u.PeakRSSByte>>20))
	}
	level, msg := slog.LevelInfo, "call ended"
	switch {
	case c.lost:
		level, msg = slog.LevelWarn, "call stopped: the connection to the engine was lost; the engine reschedules it"
	case c.outcome == metrics.OutcomeError:
		level = slog.LevelWarn
	}
	c.log.LogAttrs(context.Background(), level, msg, attrs...)
}
