package agent

// The machine owner's say over each call (agent/policy, agent/hook): the
// code policy refuses what it does not allow before the call is admitted;
// the pre-call hook may decline a call once it has a slot, before its
// runner starts (vet); the post-call hook hears how each call ended once
// its processes are gone, in the same slot.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/policy"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner"
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

// preCallInput is what the pre-call hook of call m reads on stdin; nil
// without a hook.
func (a *Agent) preCallInput(m protocol.Message, node policy.Node, env []string) []byte {
	if a.cfg.PreCallHook == "" {
		return nil
	}
	input, _ := json.Marshal(preCall{
		CallID: m.CallID, Op: m.Op, Function: protocol.CallIDText(m.Fields["function"]),
		Module: node.Module, Filename: node.Filename, SourceSHA256: node.SourceSHA256(),
		EnvKeys: policy.EnvKeys(env), CUDAVisibleDevices: callEnvValue(env, "CUDA_VISIBLE_DEVICES"), Engine: logging.ShownURL(a.cfg.URL),
	})
	return input
}

// vet runs c's pre-call hook in c's slot, so that at most --parallel hooks
// run at once, and reports whether c runs: the book moves it from vetting
// to running, or it ends there, declined (its hook said no, failed or
// timed out), cancelled or stopped while the hook ran (answered
// NodeCancelled, its hook killed), or dropped with its connection (nobody
// hears an answer). Its heartbeats meanwhile are beatWaiting's. A call
// whose hook takes it runs, whatever the worker's mode: it was admitted
// before a drain or a reload began, as a call waiting for a slot was.
func (a *Agent) vet(c *call) bool {
	if c.preCall == nil {
		a.book.begin(c)
		return true
	}
	ctx, cancel := context.WithCancel(c.ctx) // a cancel or a stop of the call
	stopOnLost := context.AfterFunc(c.attached, cancel)
	r := hook.Run(ctx, a.cfg.PreCallHook, c.preCall, nil, a.cfg.HookBound())
	stopOnLost()
	cancel()
	logHookStderr(c.log, "pre-call", r)
	var no *refusal
	switch stop := runner.Stopped(c.ctx); {
	case c.attached.Err() != nil:
		// The connection is gone: nobody hears an answer.
	case stop != nil && stop.Reason == "":
		no = &refusal{metrics.DeclinedCancelled, protocol.TypeNodeCancelled, msgCancelledWaiting}
	case stop != nil:
		no = &refusal{metrics.DeclinedCancelled, protocol.TypeNodeCancelled, stop.Error()}
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
		no = &refusal{metrics.DeclinedHook, protocol.TypeNodeCancelled, msgHookDeclined + reason}
	default:
		a.book.begin(c)
		return true
	}
	// No heartbeat follows its answer. The answer goes before the book
	// forgets the call, as a running call's does: a stopping worker
	// closes its connection once the book is empty.
	c.markAnswered()
	if no != nil {
		c.refuse(no)
	}
	running, waiting := a.book.decline(c)
	c.abandon()
	a.publishCounts(running, waiting)
	a.notify()
	return false
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
