package agent

// What the agent does with each message from the engine: start a call
// (with its environment and request line), cancel one, or log and skip
// what it cannot use.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// message is the part of an engine message the agent reads itself.
type message struct {
	fields map[string]json.RawMessage
	op     string
	callID string
}

func parseMessage(data []byte) (message, error) {
	m := message{}
	if err := json.Unmarshal(data, &m.fields); err != nil || m.fields == nil {
		return m, errors.New("not a JSON object")
	}
	if raw, ok := m.fields["op"]; ok {
		json.Unmarshal(raw, &m.op)
	}
	m.callID = callIDText(m.fields["call_id"])
	return m, nil
}

// callIDText is the call_id as text, as the reference agent's str() made
// it: a string as it is, a number as written, null or absent as "".
func callIDText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// handle acts on one engine message. Bad input is logged and skipped:
// it never takes the connection down.
func (a *Agent) handle(ctx context.Context, conn *engineConn, rt Runtime, data []byte, calls *sync.WaitGroup) {
	m, err := parseMessage(data)
	if err != nil {
		a.log.Warn("ignoring a message from the engine that is not a JSON object", "message", string(truncate(data, 200)))
		return
	}
	switch m.op {
	case "run", "compile":
		if m.callID == "" {
			a.log.Warn("ignoring a "+m.op+" without call_id", "message", string(truncate(data, 200)))
			return
		}
		a.startCall(ctx, conn, rt, m, calls)
	case "cancel":
		a.mu.Lock()
		c := a.calls[m.callID]
		a.mu.Unlock()
		if c == nil {
			a.log.Info("cancel for a call that is not running here", "call_id", m.callID)
			return
		}
		c.log.Info("cancelling")
		c.stop("")
	default:
		a.log.Warn("ignoring a message with an unknown op", "op", m.op)
	}
}

func (a *Agent) startCall(ctx context.Context, conn *engineConn, rt Runtime, m message, calls *sync.WaitGroup) {
	log := a.log.With("call_id", m.callID)
	refuse := func(typ, msg string) {
		log.Warn("call refused", "op", m.op, "reason", msg)
		a.metrics.CallDeclined(declineReason(msg))
		conn.sendJSON(newErrorAnswer(m.callID, typ, msg))
	}
	switch {
	case closed(a.stopCh) || closed(a.killCh):
		refuse(errTypeCancelled, msgStopping)
		return
	case closed(a.drainCh), a.maxCallsTaken():
		refuse(errTypeCancelled, msgDraining)
		return
	}
	env, err := a.callEnv(m.fields["env"])
	if err != nil {
		refuse(errTypeRemote, err.Error())
		return
	}
	request, err := requestLine(m.fields)
	if err != nil {
		refuse(errTypeRemote, "could not re-encode the request: "+err.Error())
		return
	}
	c := &call{
		id: m.callID, op: m.op, request: request, env: env, agent: a, conn: conn, log: log,
		started: make(chan struct{}), exited: make(chan struct{}),
	}
	a.mu.Lock()
	if _, dup := a.calls[m.callID]; dup {
		a.mu.Unlock()
		refuse(errTypeRemote, fmt.Sprintf("a call with call_id %q is already running on this worker; this duplicate was not started", m.callID))
		return
	}
	a.calls[m.callID] = c
	a.live[c] = struct{}{}
	n := len(a.calls)
	a.mu.Unlock()
	if n > a.cfg.Parallel {
		log.Warn("the engine sent more calls than --parallel; running them anyway", "running", n, "parallel", a.cfg.Parallel)
	}
	log.Info("call started", "op", m.op)
	a.metrics.CallStarted(m.op)
	a.metrics.SetRunning(n)
	a.status.Update(func(s *Status) { s.CallsRunning = n })
	a.notify()
	calls.Add(1)
	go func() {
		defer calls.Done()
		c.run(ctx, rt)
		a.mu.Lock()
		delete(a.live, c)
		a.mu.Unlock()
	}()
}

// callEnded is called once per call when the engine has its answer (or
// can no longer get one): the call no longer counts as running.
func (a *Agent) callEnded(c *call) {
	a.mu.Lock()
	if a.calls[c.id] == c {
		delete(a.calls, c.id)
	}
	a.lastDone = time.Now()
	a.done++
	if c.answered {
		a.countAnswerLocked()
	}
	n, done := len(a.calls), a.done
	a.mu.Unlock()
	a.metrics.CallFinished(c.op, c.outcome, time.Since(c.begun))
	a.metrics.SetRunning(n)
	a.status.Update(func(s *Status) { s.CallsRunning, s.CallsDone = n, done })
	a.notify()
}

// callEnv is the runner's environment: the agent's own, the artifact
// endpoint and token, and the request's env with CUDA devices read as
// positions in this worker's own CUDA_VISIBLE_DEVICES.
func (a *Agent) callEnv(raw json.RawMessage) ([]string, error) {
	env := a.baseEnv
	if len(raw) == 0 || string(raw) == "null" {
		return env, nil
	}
	var extra map[string]json.RawMessage
	if err := json.Unmarshal(raw, &extra); err != nil {
		return nil, fmt.Errorf("the request's env is not an object: %w", err)
	}
	env = append(make([]string, 0, len(env)+len(extra)), env...)
	mask := os.Getenv("CUDA_VISIBLE_DEVICES")
	for k, v := range extra {
		value := pythonStr(v)
		if k == "CUDA_VISIBLE_DEVICES" && mask != "" && value != "" {
			value = platform.RemapCUDA(mask, value)
		}
		env = append(env, k+"="+value)
	}
	return env, nil
}

// pythonStr renders a JSON value as Python's str() renders the decoded
// value, which is how the reference agent turned env values into text:
// strings as they are, True/False/None, integers exactly, floats in
// Python's repr.
func pythonStr(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "true":
		return "True"
	case "false":
		return "False"
	case "null":
		return "None"
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if !bytes.ContainsAny(raw, ".eE") {
		if n, ok := new(big.Int).SetString(string(raw), 10); ok {
			return n.String()
		}
	}
	if f, err := strconv.ParseFloat(string(raw), 64); err == nil {
		return pythonFloat(f)
	}
	return string(raw)
}

// pythonFloat is Python's repr of a float: the shortest digits that read
// back the same, fixed notation for exponents -4 to 15 (with ".0" on whole
// numbers), scientific beyond.
func pythonFloat(f float64) string {
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return sci
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
