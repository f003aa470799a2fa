package enginetest

// The engine's side of the resume extension (docs/resume.md): it accepts the
// worker's offer in its welcome, remembers the calls it sent to each worker
// (by the worker's name) with how many frames of each it received, and
// answers a reconnected worker's resume message: continue after the frames
// it has for every call it remembers, cancel for those a test marked, and
// nothing (unclaimed) for the rest. A test makes it lose its memory, as a
// restarted engine without durable state would, with Forget.

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/fluksio/fluksio-worker/agent/protocol"
)

type resumeState struct {
	ignore atomic.Bool // IgnoreResume

	mu     sync.Mutex
	calls  map[string]*Call // by worker name and call id
	cancel map[string]bool  // call ids to answer cancel
	at     map[string]int64 // call ids to answer continue after this seq, whatever the engine has
	noAcks atomic.Bool      // WithholdAcks
}

func callKey(name, id string) string { return name + "\x00" + id }

// acceptResume adds the extension's acceptance to welcome when the engine
// allows it and the worker offered it.
func (e *Engine) acceptResume(r *http.Request, welcome map[string]any) bool {
	if e.opts.Resume <= 0 {
		return false
	}
	if _, ok := protocol.ParseResumeOffer(r.Header.Get(protocol.ResumeHeader)); !ok {
		return false
	}
	welcome["resume"] = protocol.WelcomeResume{Version: protocol.ResumeVersion, Grace: e.opts.Resume.Seconds(), Ack: e.opts.ResumeAck}
	return true
}

// WithholdAcks makes an engine that asks for acknowledged answers (Options.
// ResumeAck) never send one: a broken engine.
func (e *Engine) WithholdAcks() { e.resume.noAcks.Store(true) }

// acknowledge acknowledges a call's answer the engine read, when its
// welcome asked for acknowledged answers.
func (w *Worker) acknowledge(id string) {
	if w.engine == nil || !w.engine.opts.ResumeAck || w.engine.resume.noAcks.Load() {
		return
	}
	go w.Send(map[string]any{"op": protocol.OpAck, "call_id": id}) // not from the read loop, as resumeMessage
}

// keep remembers a call sent to w, so a later connection of the same
// worker can resume it.
func (e *Engine) keep(w *Worker, c *Call) {
	e.resume.mu.Lock()
	defer e.resume.mu.Unlock()
	if e.resume.calls == nil {
		e.resume.calls = map[string]*Call{}
	}
	e.resume.calls[callKey(w.Hello.Name, c.ID)] = c
}

// Forget drops what the engine remembers of calls: it then claims none.
func (e *Engine) Forget() {
	e.resume.mu.Lock()
	defer e.resume.mu.Unlock()
	e.resume.calls = nil
}

// IgnoreResume makes the engine read workers' resume messages and never
// answer them: an engine that accepted the extension, then hangs.
func (e *Engine) IgnoreResume() { e.resume.ignore.Store(true) }

// CancelOnResume makes the engine answer cancel for these calls when a
// worker says it holds them.
func (e *Engine) CancelOnResume(ids ...string) {
	e.resume.mu.Lock()
	defer e.resume.mu.Unlock()
	if e.resume.cancel == nil {
		e.resume.cancel = map[string]bool{}
	}
	for _, id := range ids {
		e.resume.cancel[id] = true
	}
}

// ContinueAt makes the engine answer continue after seq for the call id,
// whatever it received: an engine that asks for frames the worker cannot
// serve.
func (e *Engine) ContinueAt(id string, seq int64) {
	e.resume.mu.Lock()
	defer e.resume.mu.Unlock()
	if e.resume.at == nil {
		e.resume.at = map[string]int64{}
	}
	e.resume.at[id] = seq
}

// GoDown drops every connection and stops listening, until ComeBack: an
// engine outage whose end the test chooses.
func (e *Engine) GoDown() {
	e.stopServing()
	e.DropAll()
}

// ComeBack listens again on the engine's address after GoDown.
func (e *Engine) ComeBack() error {
	_, err := e.listen(e.addr)
	return err
}

// resumeMessage answers a worker's resume message; it reports false for a
// frame that is not one.
func (e *Engine) resumeMessage(w *Worker, raw []byte) bool {
	var msg protocol.ResumeHello
	if json.Unmarshal(raw, &msg) != nil || msg.Op != protocol.OpResume {
		return false
	}
	if e.resume.ignore.Load() {
		select {
		case w.resume <- msg:
		default:
		}
		return true
	}
	answer := map[string]any{"op": protocol.OpResume}
	verdicts := []protocol.ResumeVerdict{}
	e.resume.mu.Lock()
	for _, held := range msg.Calls {
		c := e.resume.calls[callKey(w.Hello.Name, held.CallID)]
		switch {
		case c == nil:
		case e.resume.cancel[held.CallID]:
			verdicts = append(verdicts, protocol.ResumeVerdict{CallID: held.CallID, Action: protocol.ResumeCancel})
			w.adopt(c)
		default:
			seq, forced := e.resume.at[held.CallID]
			if !forced {
				seq = c.Seq()
			}
			verdicts = append(verdicts, protocol.ResumeVerdict{CallID: held.CallID, Action: protocol.ResumeContinue, Seq: seq})
			w.adopt(c)
		}
	}
	e.resume.mu.Unlock()
	answer["calls"] = verdicts
	select {
	case w.resume <- msg:
	default:
	}
	go w.Send(answer) // not from the read loop: a send may wait for the worker to read
	return true
}

// adopt makes this connection's frames of c go to c.
func (w *Worker) adopt(c *Call) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls[c.ID] = c
}

// Resumed waits for the worker's resume message on this connection: the
// calls it said it holds.
func (w *Worker) Resumed(ctx context.Context) (protocol.ResumeHello, error) {
	select {
	case m := <-w.resume:
		return m, nil
	case <-ctx.Done():
		return protocol.ResumeHello{}, ctx.Err()
	}
}
