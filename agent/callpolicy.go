package agent

// The machine owner's say over each call (agent/policy, agent/hook): the
// code policy refuses what it does not allow, and the pre-call hook may
// decline a call, both before the call takes a slot; the post-call hook
// hears how each call ended once its processes are gone.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/policy"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// msgHookDeclined opens the answer to a call the pre-call hook declined;
// like a drain's, it is NodeCancelled, so the engine runs the call on
// another worker.
const msgHookDeclined = "declined by this worker's pre-call hook: "

// checkPolicy refuses a call the code policy does not allow: its node
// (a module outside --allow-module, source --allow-source refuses) or its
// env (a variable neither tuning nor --allow-env allows). It also returns
// the node, for the pre-call hook.
func (a *Agent) checkPolicy(m protocol.Message, env []string) (policy.Node, *refusal) {
	node, err := policy.ReadNode(m.Fields["node"])
	if err != nil {
		return node, &refusal{metrics.DeclinedInvalid, protocol.TypeRemoteError, "the request's " + err.Error()}
	}
	p := a.cfg.Policy
	no := p.CheckNode(node)
	if no == nil {
		no = p.CheckEnv(env, os.Getenv("PATH"))
	}
	if no != nil {
		return node, &refusal{metrics.DeclinedPolicy, policy.ErrorType, no.Error()}
	}
	return node, nil
}

// preCall is what a pre-call hook reads on stdin.
type preCall struct {
	CallID       string   `json:"call_id"`
	Op           string   `json:"op"`
	Function     string   `json:"function"`
	Module       string   `json:"module,omitempty"`
	Filename     string   `json:"filename,omitempty"`
	SourceSHA256 string   `json:"source_sha256,omitempty"`
	EnvKeys      []string `json:"env_keys"`
	// CUDAVisibleDevices is the call's CUDA_VISIBLE_DEVICES, as its
	// process gets it (positions in the worker's own mask), for a hook
	// that checks its GPUs are free; the env's other values may be
	// secrets and are not shown.
	CUDAVisibleDevices string `json:"cuda_visible_devices,omitempty"`
	Engine             string `json:"engine"`
}

// pendingCalls are the calls whose pre-call hook runs: not yet in the
// book, but a cancel must find them.
type pendingCalls struct {
	mu sync.Mutex
	m  map[string]context.CancelFunc
}

func (p *pendingCalls) add(id string, cancel context.CancelFunc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.m[id]; dup {
		return false
	}
	if p.m == nil {
		p.m = map[string]context.CancelFunc{}
	}
	p.m[id] = cancel
	return true
}

func (p *pendingCalls) remove(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, id)
}

// cancel stops the hook of call id, if one runs; the call is then
// answered as cancelled before it started.
func (p *pendingCalls) cancel(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	stop, ok := p.m[id]
	if ok {
		stop()
	}
	return ok
}

// askPreCallHook runs the pre-call hook of a call on its own goroutine
// (the connection's messages are read on meanwhile), sending the call's
// heartbeats while it runs, then admits the call or declines it.
func (a *Agent) askPreCallHook(at *attachment, m protocol.Message, node policy.Node, env []string, request []byte, refuse func(*refusal)) {
	ctx, cancel := context.WithCancel(at.ctx)
	if !at.pending.add(m.CallID, cancel) {
		cancel()
		refuse(&refusal{metrics.DeclinedInvalid, protocol.TypeRemoteError, "a call with this call_id is already waiting for this worker's pre-call hook"})
		return
	}
	input, _ := json.Marshal(preCall{
		CallID: m.CallID, Op: m.Op, Function: protocol.CallIDText(m.Fields["function"]),
		Module: node.Module, Filename: node.Filename, SourceSHA256: node.SourceSHA256(),
		EnvKeys: policy.EnvKeys(env), CUDAVisibleDevices: callEnvValue(env, "CUDA_VISIBLE_DEVICES"), Engine: logging.ShownURL(a.cfg.URL),
	})
	at.calls.Add(1)
	go func() {
		defer at.calls.Done()
		defer cancel()
		beat := time.NewTicker(protocol.HeartbeatInterval)
		defer beat.Stop()
		done := make(chan hook.Result, 1)
		go func() { done <- hook.Run(ctx, a.cfg.PreCallHook, input, nil, a.cfg.HookBound()) }()
		var r hook.Result
	wait:
		for {
			select {
			case r = <-done:
				break wait
			case <-beat.C:
				at.conn.SendJSON(protocol.NewHeartbeat(m.CallID))
			}
		}
		at.pending.remove(m.CallID)
		logHookStderr(a.log.With("call_id", logging.Cut(m.CallID, maxLoggedID)), "pre-call", r)
		switch {
		case at.ctx.Err() != nil:
			return // the connection is gone: nobody hears an answer
		case ctx.Err() != nil:
			refuse(&refusal{metrics.DeclinedCancelled, protocol.TypeNodeCancelled, msgCancelledWaiting})
			return
		case !r.OK():
			reason := r.Reason
			switch {
			case r.TimedOut:
				reason = fmt.Sprintf("it did not answer within %s", a.cfg.HookBound())
			case r.Err != nil:
				reason = r.Err.Error()
			case reason == "":
				reason = fmt.Sprintf("it exited %d", r.Exit)
			}
			refuse(&refusal{metrics.DeclinedHook, protocol.TypeNodeCancelled, msgHookDeclined + reason})
			return
		}
		if no := a.modeRefusal(); no != nil {
			refuse(no)
			return
		}
		a.admitCall(at, m, request, env, refuse)
	}()
}

// callEnvValue is key's value in env (KEY=VALUE entries), "" when unset.
func callEnvValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

// postCall is what a post-call hook reads on stdin.
type postCall struct {
	CallID     string `json:"call_id"`
	Op         string `json:"op"`
	Function   string `json:"function"`
	Outcome    string `json:"outcome"` // ok, error or cancelled
	ErrorType  string `json:"error_type,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	CPUMS      int64  `json:"cpu_ms"`
	PeakRSSMB  int64  `json:"peak_rss_mb"`
	Engine     string `json:"engine"`
}

// afterCall runs the post-call hook of a call whose processes are gone,
// in the call's slot and within the hook's bound; a hook that fails is
// logged, and the call's answer (sent already) stays as it was.
func (a *Agent) afterCall(c *call) {
	if a.cfg.PostCallHook == "" {
		return
	}
	since := c.begun
	if since.IsZero() {
		since = c.arrived
	}
	out := postCall{CallID: c.id, Op: c.op, Function: c.function, Outcome: c.outcome, ErrorType: c.errType,
		DurationMS: time.Since(since).Milliseconds(), Engine: logging.ShownURL(a.cfg.URL)}
	if c.usage != nil {
		out.CPUMS, out.PeakRSSMB = c.usage.CPU.Milliseconds(), c.usage.PeakRSSByte>>20
	}
	input, _ := json.Marshal(out)
	r := hook.Run(context.Background(), a.cfg.PostCallHook, input, nil, a.cfg.HookBound())
	logHookStderr(c.log, "post-call", r)
	switch {
	case r.OK():
	case r.Err != nil:
		c.log.Warn("the post-call hook failed; the call's answer stands", "error", r.Err, "stderr", r.Reason)
	default:
		c.log.Warn("the post-call hook failed; the call's answer stands", "exit", r.Exit, "stderr", r.Reason)
	}
}

// logHookStderr logs what a hook wrote on stderr, whatever its exit: a
// hook that takes the call may still say why it almost did not (a missing
// tool, a warning), and that must not go nowhere.
func logHookStderr(log *slog.Logger, which string, r hook.Result) {
	if r.Stderr != "" {
		log.Debug("the "+which+" hook wrote on stderr", "exit", r.Exit, "stderr", r.Stderr)
	}
}
