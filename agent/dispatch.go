package agent

// What the agent does with each message from the engine: start a call
// (with its environment and request line), cancel one, or log and skip
// what it cannot use.

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// msgUnreadable answers a call whose request this worker cannot decode
// although its op and call_id can be read.
const msgUnreadable = "the worker cannot read this request: it is not valid JSON, or nested deeper than 10000 levels"

// handle acts on one engine message. Bad input is logged and skipped:
// it never takes the connection down.
func (a *Agent) handle(at *attachment, data []byte) {
	m, err := protocol.ParseMessage(data)
	if err != nil {
		if op, id, ok := protocol.SalvageCall(data); ok && (op == protocol.OpRun || op == protocol.OpCompile) {
			// Still a call the engine waits on: it gets its answer.
			if at.noise.Allow() {
				a.log.Warn("call refused: the request cannot be read", "call_id", logging.Cut(id, maxLoggedID), "error", err)
			}
			a.declined(metrics.DeclinedInvalid)
			at.conn.SendJSON(protocol.NewErrorAnswer(id, protocol.TypeRemoteError, msgUnreadable))
			return
		}
		if at.noise.Allow() {
			a.log.Warn("ignoring a message from the engine that is not a JSON object", "message", logging.Cut(data, 200))
		}
		return
	}
	switch m.Op {
	case protocol.OpRun, protocol.OpCompile:
		if m.CallID == "" {
			if at.noise.Allow() {
				a.log.Warn("ignoring a call without call_id", "op", m.Op, "message", logging.Cut(data, 200))
			}
			return
		}
		a.startCall(at, m)
	case protocol.OpCancel:
		a.cancel(at, m.CallID)
	case protocol.OpResume:
		a.resumeAnswered(at, m)
	case protocol.OpAck:
		a.acked(at, m.CallID)
	default:
		if at.noise.Allow() {
			a.log.Warn("ignoring a message with an unknown op", "op", logging.Cut(m.Op, maxLoggedID))
		}
	}
}

func (a *Agent) startCall(at *attachment, m protocol.Message) {
	log := a.log.With("call_id", logging.Cut(m.CallID, maxLoggedID))
	refuse := func(no *refusal) {
		if at.noise.Allow() {
			log.Warn("call refused", "op", m.Op, "reason", no.msg)
		}
		a.declined(no.reason)
		at.conn.SendJSON(protocol.NewErrorAnswer(m.CallID, no.typ, no.msg))
	}
	if no := a.modeRefusal(); no != nil {
		refuse(no)
		return
	}
	env, err := requestEnv(m.Fields["env"])
	if err != nil {
		refuse(&refusal{metrics.DeclinedInvalid, protocol.TypeRemoteError, err.Error()})
		return
	}
	node, no := a.checkPolicy(m, env)
	if no != nil {
		refuse(no)
		return
	}
	request, err := protocol.RequestLine(m.Fields)
	if err != nil {
		refuse(&refusal{metrics.DeclinedInvalid, protocol.TypeRemoteError, "could not re-encode the request: " + err.Error()})
		return
	}
	a.admitCall(at, m, request, env, a.preCallInput(m, node, env), refuse)
}

// modeRefusal declines a call the worker takes none of now: it stops,
// drains, reloads, its queue is full, or its disk is (diskRefusal).
func (a *Agent) modeRefusal() *refusal {
	switch mode := a.life.mode(); {
	case mode.ending():
		return &refusal{metrics.DeclinedStopping, protocol.TypeNodeCancelled, msgStopping}
	case mode == modeDraining, a.book.full():
		return &refusal{metrics.DeclinedDraining, protocol.TypeNodeCancelled, msgDraining}
	case mode == modeReloading:
		return &refusal{metrics.DeclinedReloading, protocol.TypeNodeCancelled, msgReloading}
	}
	return a.diskRefusal()
}

// admitCall gives an accepted call a slot, or a place in the queue; in its
// slot, its pre-call hook (preCall its input, nil without one) decides
// whether it runs, and refuse answers it if not.
func (a *Agent) admitCall(at *attachment, m protocol.Message, request []byte, env []string, preCall []byte, refuse func(*refusal)) {
	log := a.log.With("call_id", logging.Cut(m.CallID, maxLoggedID))
	now := time.Now()
	c := newCall(m.CallID, m.Op, protocol.CallIDText(m.Fields["function"]), request, env,
		callHost{metrics: a.metrics, runners: a.runners, ended: a.callEnded}, at.conn, log, now)
	c.preCall, c.refuse = preCall, refuse
	at.adopt(a, c)
	start, no := a.book.admit(c)
	if no != nil {
		c.abandon()
		refuse(no)
		return
	}
	running, waiting := a.book.counts()
	a.publishCounts(running, waiting)
	a.notify()
	if !start {
		log.Info("call queued: every --parallel slot is busy", "op", m.Op, "parallel", a.cfg.Parallel, "waiting", waiting)
		return
	}
	log.Info("call started", "op", m.Op, "function", logging.Cut(c.function, maxLoggedID))
	c.wg.Add(1)
	go a.runSlot(c)
}

// cancel stops a running call, or answers a waiting one without starting
// it; one whose pre-call hook runs has its hook stopped, and is answered as
// cancelled before it started (vet).
func (a *Agent) cancel(at *attachment, id string) {
	c, waiting := a.book.leaveQueue(id)
	switch {
	case c == nil:
		if at.noise.Allow() {
			a.log.Info("cancel for a call that is not running here", "call_id", logging.Cut(id, maxLoggedID))
		}
	case waiting:
		c.answerError(protocol.TypeNodeCancelled, msgCancelledWaiting)
		a.callEnded(c)
	default:
		c.log.Info("cancelling")
		c.stop("")
	}
}

// publishCounts shows how many calls run and wait in the status file and
// the metrics.
func (a *Agent) publishCounts(running, waiting int) {
	a.metrics.SetRunning(running)
	a.metrics.SetQueued(waiting)
	a.status.Update(func(s *status.Status) { s.CallsRunning, s.CallsQueued = running, waiting })
}

// callEnded is called once per call when the engine has its answer (or
// can no longer get one): the call no longer counts as running.
func (a *Agent) callEnded(c *call) {
	ok, from, running, waiting, done, lastAllowed := a.book.end(c, c.wasAnswered())
	if !ok {
		return // ended already: each call ends once
	}
	if lastAllowed {
		a.endBecause("--max-calls answered")
		a.log.Info("--max-calls answered; draining", "max_calls", a.cfg.MaxCalls)
		a.Drain()
	}
	if from == callLeaving {
		a.declined(metrics.DeclinedCancelled) // answered (or dropped) while waiting
	} else {
		a.metrics.CallFinished(c.op, c.outcome, time.Since(c.begun))
	}
	if c.proc.Load() == nil {
		c.logEnd(nil) // no runner to wait for: its end is now
	}
	// One change: a status read between two would show the call neither
	// running nor done.
	a.metrics.SetRunning(running)
	a.metrics.SetQueued(waiting)
	a.status.Update(func(s *status.Status) { s.CallsRunning, s.CallsQueued, s.CallsDone = running, waiting, done })
	a.notify()
	a.cacheMayHaveGrown()
}

// declined counts a call answered without running, by its reason, in the
// metrics and in the status file, where `status` shows it.
func (a *Agent) declined(reason metrics.DeclineReason) {
	a.metrics.CallDeclined(reason)
	a.status.Update(func(s *status.Status) {
		if s.CallsDeclined == nil {
			s.CallsDeclined = map[string]int64{}
		}
		s.CallsDeclined[string(reason)]++
	})
}

// requestEnv is the request's env as KEY=VALUE entries, with CUDA devices
// read as positions in this worker's own CUDA_VISIBLE_DEVICES. A waiting
// call keeps only these; the full environment is made when it starts.
func requestEnv(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var extra map[string]json.RawMessage
	if err := json.Unmarshal(raw, &extra); err != nil {
		return nil, fmt.Errorf("the request's env is not an object: %w", err)
	}
	env := make([]string, 0, len(extra))
	mask := os.Getenv("CUDA_VISIBLE_DEVICES")
	for k, v := range extra {
		value := protocol.EnvText(v)
		if k == "CUDA_VISIBLE_DEVICES" && mask != "" && value != "" {
			value = platform.RemapCUDA(mask, value)
		}
		env = append(env, k+"="+value)
	}
	return env, nil
}
