package agent_test

// A whole session in this process, without building the binary: the fake
// engine on loopback, an Agent serving it, and real node code running on a
// real Python through the embedded runtime. It covers attaching (what the
// hello says, what the worker says about itself), a generator call, a
// cancel, and a stop, and that nothing of the calls outlives them.
//
// Everything the test asks of the agent package is in startSession, so
// that moving Config, Load or NewLogger elsewhere changes that function
// only.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runtime"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// What the session's worker is configured with, and what its hello must
// then say.
const (
	sessionName  = "session-test"
	sessionToken = "session-test-token-5f0c7a1e9b"
	// Blanks and an empty label are dropped, as the protocol says.
	sessionLabelsFlag = " cpu, session-test ,,x86 "
	sessionParallel   = 2
	sessionCPUs       = 3
	sessionGPUs       = 0
	sessionRAMMB      = 2048
)

var sessionLabels = []string{"cpu", "session-test", "x86"}

// Generous bounds, for a loaded two-core machine: a wait only ends early,
// so none of them makes the test slower when things work.
const (
	attachTimeout = 90 * time.Second  // FindPython, pip freeze and the dial
	callTimeout   = 180 * time.Second // a 48 MiB answer under the race detector took 70 s at load 20
	goneTimeout   = 30 * time.Second
)

// session is a worker attached to the fake engine in this process.
type session struct {
	eng      *enginetest.Engine
	wk       *enginetest.Worker
	stop     func()        // Agent.Stop
	pulse    func() string // Agent.Pulse
	health   func() (bool, string)
	served   chan error         // Serve's result
	python   string             // the interpreter, as FindPython resolved it
	given    string             // --python as given, what hello must carry
	stateDir string             // as ResolveStateDir made it
	runtime  string             // the embedded runner's path in the state directory
	log      *enginetest.Buffer // the worker's log, shown when the test fails
}

// startSession is the one place that builds a worker from the agent
// package's API, the way `fluksio-worker run` does: options parsed by Load
// from flags, Resolve, the Python found by platform.FindPython, the state
// directory made by ResolveStateDir, the runner written by EnsureRuntime,
// then New and Serve in a goroutine. It returns once the engine has
// welcomed the worker. It skips the test when no Python 3.8+ is found.
// extra options come after the session's own, so they win.
func startSession(t *testing.T, extra ...string) *session {
	t.Helper()
	return startSessionWith(t, enginetest.Options{}, extra...)
}

// startSessionWith is startSession with an engine started with opts (its
// Tokens are the session's).
func startSessionWith(t *testing.T, opts enginetest.Options, extra ...string) *session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	given, python := findPython(ctx, t)

	opts.Tokens = []string{sessionToken}
	eng, err := enginetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)

	cfg, stateDir := loadConfig(t, append([]string{
		"--url", eng.AttachURL(),
		"--token", sessionToken,
		"--name", sessionName,
		"--labels", sessionLabelsFlag,
		"--python", given,
		"--parallel", strconv.Itoa(sessionParallel),
		"--cpus", strconv.Itoa(sessionCPUs),
		"--gpus", strconv.Itoa(sessionGPUs),
		"--ram-mb", strconv.Itoa(sessionRAMMB),
		"--runtime", "embedded",
		"--cancel-grace", "2s",
		"--state-dir", filepath.Join(t.TempDir(), "state"),
		"--log-level", "debug",
	}, extra...))
	logs := &enginetest.Buffer{}
	log := logging.NewLogger(logs, cfg.LogFormat, cfg.LogLevel, cfg.Token)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the worker's log:\n%s", logs.String())
		}
	})
	rt, err := runtime.Ensure(ctx, cfg, stateDir, log)
	if err != nil {
		t.Fatalf("EnsureRuntime: %v", err)
	}
	if rt.Source != "embedded" || !strings.HasPrefix(rt.Path, stateDir+string(os.PathSeparator)) {
		t.Fatalf("EnsureRuntime gave %+v; want the embedded runner in %s", rt, stateDir)
	}
	// Runners start from it compiled for the interpreter, as the worker
	// compiles it when it attaches.
	rt = runtime.WithBytecode(ctx, python, rt, log)
	script := rt.Bytecode
	if script == "" {
		t.Fatalf("the embedded runner could not be compiled for %s", python)
	}

	a := agent.New(cfg, log, python, stateDir)
	s := &session{
		eng: eng, stop: a.Stop, pulse: a.Pulse, health: a.Health,
		served: make(chan error, 1), python: python, given: given,
		stateDir: stateDir, runtime: script, log: logs,
	}
	go func() { s.served <- a.Serve(context.Background()) }()
	// Whatever happens to the test, the worker does not outlive it.
	t.Cleanup(func() {
		a.Stop()
		select {
		case <-s.served:
		case <-time.After(goneTimeout):
			t.Errorf("Serve did not return within %s of Stop", goneTimeout)
		}
	})
	select {
	case <-a.Attaching():
	case err := <-s.served:
		t.Fatalf("Serve returned before attaching: %v", err)
	case <-ctx.Done():
		t.Fatal("the worker never started to attach")
	}
	if s.wk, err = eng.NextWorker(ctx); err != nil {
		select {
		case err := <-s.served:
			t.Fatalf("Serve returned without attaching: %v", err)
		default:
		}
		t.Fatal(err)
	}
	return s
}

// findPython finds the interpreter nodes run on as `run` does, with
// platform.FindPython (which checks for Python 3.8 or newer): the one in
// $FLUKSIO_TEST_PYTHON, else Debian's /usr/bin/python3, else python3 on
// PATH. It returns --python as given and the path found.
func findPython(ctx context.Context, t *testing.T) (given, path string) {
	t.Helper()
	var why []string
	for _, p := range []string{os.Getenv("FLUKSIO_TEST_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		path, _, err := platform.FindPython(ctx, p)
		if err == nil {
			return p, path
		}
		why = append(why, err.Error())
	}
	t.Skipf("no Python 3.8 or newer to run nodes on: %s", strings.Join(why, "; "))
	return "", ""
}

// The node code the calls run. count is a generator node that prints and
// yields in turn; hang reports its pid, process group and a child it
// started, then sleeps until it is stopped.
const sessionNodes = `
import os, subprocess, sys, time
from fluksio import Port, node

@node(requires=[Port("n", "int")],
      provides=[Port("step", "int", stream=True), Port("loss", "float", stream=True), Port("total", "int")])
def count(n):
    total = 0
    for i in range(n):
        total += i * i
        print("step %d" % i)
        yield {"step": i, "loss": 1.0 / (i + 1)}
    return total

@node(provides=[Port("pid", "int", stream=True), Port("pgid", "int", stream=True),
                Port("child", "int", stream=True), Port("done", "bool")])
def hang():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield {"pid": os.getpid(), "pgid": os.getpgid(0), "child": child.pid}
    time.sleep(600)
    return True
`

func nodeCall(id, function string, inputs map[string]any) map[string]any {
	return sourceCall(sessionNodes, "session_nodes.py", id, function, inputs)
}

// sourceCall is a run request for function of a node's source.
func sourceCall(source, filename, id, function string, inputs map[string]any) map[string]any {
	return map[string]any{
		"op": "run", "call_id": id,
		"node":     map[string]any{"source": source, "filename": filename},
		"function": function, "inputs": inputs, "settings": map[string]any{},
	}
}

func TestSessionInProcess(t *testing.T) {
	before := goroutineIDs()
	kidsBefore := children()
	s := startSession(t)

	t.Run("attach", func(t *testing.T) { s.checkAttached(t) })
	t.Run("generator", func(t *testing.T) { s.checkGenerator(t) })
	var pids []int
	t.Run("cancel", func(t *testing.T) { pids = s.checkCancel(t) })
	t.Run("stop", func(t *testing.T) { s.checkStop(t, before, kidsBefore, pids) })
}

// checkAttached: the hello carries the configuration, and the worker says
// it is attached in its pulse line, its health and its status file.
func (s *session) checkAttached(t *testing.T) {
	h := s.wk.Hello
	if h.Op != "hello" || h.Protocol != protocol.Version || h.Name != sessionName {
		t.Errorf("hello op %q protocol %d name %q; want hello, %d, %q", h.Op, h.Protocol, h.Name, protocol.Version, sessionName)
	}
	if strings.Join(h.Labels, ",") != strings.Join(sessionLabels, ",") {
		t.Errorf("hello labels %q; want %q (--labels %q)", h.Labels, sessionLabels, sessionLabelsFlag)
	}
	if h.MaxParallel != sessionParallel {
		t.Errorf("hello max_parallel %d; want --parallel %d", h.MaxParallel, sessionParallel)
	}
	if h.Python != s.given {
		t.Errorf("hello python %q; want --python as given, %q", h.Python, s.given)
	}
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(h.VenvDigest) {
		t.Errorf("hello venv_digest %q; want 16 hex characters (pip freeze's output hashed, even when empty)", h.VenvDigest)
	}
	inv := h.Inventory
	if inv.CPUs != sessionCPUs || inv.GPUs != sessionGPUs || inv.RAMMB == nil || *inv.RAMMB != sessionRAMMB {
		t.Errorf("hello inventory %s; want the flags: %d CPUs, %d GPUs, %d MiB", jsonOf(inv), sessionCPUs, sessionGPUs, sessionRAMMB)
	}
	// The raw frame: every field of the protocol's hello, and no token.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(h.Raw, &raw); err != nil {
		t.Fatalf("hello %s: %v", h.Raw, err)
	}
	for _, k := range []string{"op", "protocol", "name", "labels", "python", "max_parallel", "venv_digest", "inventory"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("hello has no %q: %s", k, h.Raw)
		}
	}
	if bytes.Contains(h.Raw, []byte(sessionToken)) {
		t.Errorf("hello carries the token: %s", h.Raw)
	}
	if n := len(s.eng.Hellos()); n != 1 {
		t.Errorf("the engine got %d hellos; want 1", n)
	}

	// The engine counts the worker welcomed when it sends the welcome; the
	// worker, once it has read it.
	var line string
	eventually(t, goneTimeout, fmt.Sprintf("Pulse to say attached as %q, 0 running, 0 done", sessionName), func() bool {
		line = s.pulse()
		return strings.Contains(line, fmt.Sprintf("attached as %q", sessionName)) && strings.Contains(line, "0 running, 0 done")
	}, func() string { return "last: " + line })
	if ok, reason := s.health(); !ok || !strings.HasPrefix(reason, "ok: attached") {
		t.Errorf("Health() = %v, %q; want healthy, attached", ok, reason)
	}
	// The status file is written at most once a second.
	var st status.Status
	eventually(t, goneTimeout, "the status file to say attached", func() bool {
		var err error
		st, err = status.Read(s.stateDir)
		return err == nil && st.State == "attached"
	})
	if st.Name != sessionName || st.PID != os.Getpid() || strings.Contains(st.Engine, sessionToken) {
		t.Errorf("status %+v; want name %q, this process, no token", st, sessionName)
	}
	for _, dir := range []string{s.stateDir, filepath.Join(s.stateDir, "runtime")} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v; want a private directory (0700)", dir, fi.Mode(), err)
		}
	}
}

// checkGenerator runs a generator node through the embedded runtime: what
// it prints and yields arrives in order, then its answer.
func (s *session) checkGenerator(t *testing.T) {
	const n = 5
	c, err := s.wk.Run(nodeCall("gen-1", "count", map[string]any{"n": n}))
	if err != nil {
		t.Fatal(err)
	}
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatalf("no answer: %v; events %s", err, rawOf(events))
	}
	var out struct {
		CallID  string         `json:"call_id"`
		OK      bool           `json:"ok"`
		Outputs map[string]any `json:"outputs"`
	}
	if err := answer.Decode(&out); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range n {
		want += i * i
	}
	if !out.OK || out.CallID != "gen-1" || out.Outputs["total"] != float64(want) {
		t.Errorf("answer %s; want ok, outputs {\"total\": %d}", answer.Raw, want)
	}
	// The runtime drains the node's output before each stream event, so a
	// print and the yield after it arrive in that order.
	var got, wantSeq []string
	for i := range n {
		wantSeq = append(wantSeq, fmt.Sprintf("log step %d", i), fmt.Sprintf("stream step=%d loss=%g", i, 1.0/float64(i+1)))
	}
	for _, m := range events {
		var ev struct {
			CallID string             `json:"call_id"`
			Event  string             `json:"event"`
			Line   string             `json:"line"`
			Values map[string]float64 `json:"values"`
		}
		if err := m.Decode(&ev); err != nil {
			t.Fatalf("event %s: %v", m.Raw, err)
		}
		if ev.CallID != "gen-1" {
			t.Errorf("event of another call: %s", m.Raw)
		}
		switch ev.Event {
		case "log":
			got = append(got, "log "+ev.Line)
		case "stream":
			got = append(got, fmt.Sprintf("stream step=%g loss=%g", ev.Values["step"], ev.Values["loss"]))
		}
	}
	if strings.Join(got, "\n") != strings.Join(wantSeq, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s\n(all frames: %s)", strings.Join(got, "\n"), strings.Join(wantSeq, "\n"), rawOf(events))
	}
	eventually(t, goneTimeout, "the call to be counted done", func() bool {
		return strings.Contains(s.pulse(), "0 running, 1 done")
	})
}

// checkCancel cancels a call whose node sleeps, with a child process: the
// answer is NodeCancelled and the runner, its process group and its child
// are gone. It returns the pids it saw.
func (s *session) checkCancel(t *testing.T) []int {
	c, err := s.wk.Run(nodeCall("hang-1", "hang", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	pid, pgid, child := s.hangPids(t, c)
	if pgid != pid {
		t.Errorf("the runner %d is in process group %d; want its own group", pid, pgid)
	}
	// A spare runner (warm.go) has arguments of its own after these.
	if cmd := cmdline(pid); len(cmd) < 2 || cmd[0] != s.python || cmd[1] != s.runtime {
		t.Errorf("the runner %d runs %q; want %s %s, the embedded runtime compiled", pid, cmd, s.python, s.runtime)
	}
	if !platform.ProcessAlive(child) {
		t.Fatalf("the node's child %d is not running", child)
	}
	if err := s.wk.Cancel("hang-1"); err != nil {
		t.Fatal(err)
	}
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatalf("no answer to the cancel: %v; events %s", err, rawOf(events))
	}
	if answer.OK || answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Errorf("the cancelled call answered %s; want NodeCancelled", answer.Raw)
	}
	s.checkGone(t, "the cancelled call", pid, pgid, child)
	return []int{pid, child}
}

// hangPids reads the pids the hang node yields.
func (s *session) hangPids(t *testing.T, c *enginetest.Call) (pid, pgid, child int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for {
		m, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("%s: no stream event: %v", c.ID, err)
		}
		if m.IsAnswer() {
			t.Fatalf("%s answered before it yielded: %s", c.ID, m.Raw)
		}
		if m.Event != "stream" {
			continue
		}
		var ev struct {
			Values struct{ PID, PGID, Child int } `json:"values"`
		}
		if err := m.Decode(&ev); err != nil || ev.Values.PID == 0 || ev.Values.Child == 0 {
			t.Fatalf("%s: stream event %s: %v", c.ID, m.Raw, err)
		}
		pid, pgid, child = ev.Values.PID, ev.Values.PGID, ev.Values.Child
		// Should the worker fail to stop them, they do not outlive the
		// test: each is killed if it still runs what it ran.
		t.Cleanup(func() {
			if cmd := cmdline(pid); platform.ProcessAlive(pid) && len(cmd) > 1 && cmd[1] == s.runtime && pgid == pid {
				syscall.Kill(-pgid, syscall.SIGKILL)
			}
			if cmd := cmdline(child); platform.ProcessAlive(child) && strings.Contains(strings.Join(cmd, " "), "time.sleep(600)") {
				syscall.Kill(child, syscall.SIGKILL)
			}
		})
		return pid, pgid, child
	}
}

// checkGone waits for a call's processes to be gone: the runner, its
// process group, and the child the node started.
func (s *session) checkGone(t *testing.T, what string, pid, pgid, child int) {
	t.Helper()
	eventually(t, goneTimeout, what+"'s runner, child and process group to be gone", func() bool {
		return !platform.ProcessAlive(pid) && !platform.ProcessAlive(child) && !groupAlive(pgid)
	})
}

// checkStop stops the worker while a call runs: the call is answered
// NodeCancelled, the connection closes cleanly, Serve returns nil, and
// nothing the session started remains: no process (runners, the node's
// children, spare runners), no goroutine of the agent's.
func (s *session) checkStop(t *testing.T, before map[string]bool, kidsBefore map[int]bool, earlier []int) {
	c, err := s.wk.Run(nodeCall("hang-2", "hang", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	pid, pgid, child := s.hangPids(t, c)
	s.stop()
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatalf("no answer to the call running at Stop: %v; events %s", err, rawOf(events))
	}
	if answer.OK || answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Errorf("the call running at Stop answered %s; want NodeCancelled", answer.Raw)
	}
	select {
	case err := <-s.served:
		if err != nil {
			t.Errorf("Serve returned %v after Stop; want nil", err)
		}
		s.served <- err // for the cleanup's wait
	case <-time.After(goneTimeout):
		t.Fatalf("Serve did not return within %s of Stop", goneTimeout)
	}
	select {
	case <-s.wk.Done():
	case <-time.After(goneTimeout):
		t.Fatal("the connection is still open after Serve returned")
	}
	if code, text := s.wk.CloseFrame(); code != enginetest.CloseNormal {
		t.Errorf("the worker closed with %d %q; want a normal close frame", code, text)
	}
	s.checkGone(t, "the call running at Stop", pid, pgid, child)
	for _, p := range earlier {
		if platform.ProcessAlive(p) {
			t.Errorf("process %d of an earlier call is alive", p)
		}
	}
	// Spare runners included: Serve returns only once they are stopped.
	var kids []int
	eventually(t, goneTimeout, "the session's child processes (runners, spares) to be gone and reaped", func() bool {
		kids = newChildren(kidsBefore)
		return len(kids) == 0
	}, func() string { return fmt.Sprint(describe(kids)) })
	var leaked []string
	eventually(t, goneTimeout, "the agent's goroutines to end", func() bool {
		leaked = agentGoroutines(before)
		return len(leaked) == 0
	}, func() string { return strings.Join(leaked, "\n\n") })
	if st, err := status.Read(s.stateDir); err != nil || st.State != "stopped" {
		t.Errorf("status file %+v, %v; want stopped", st, err)
	}
}

// eventually polls cond until it holds or timeout passes; detail, if
// given, says what was left.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			more := ""
			for _, d := range detail {
				more += ": " + d()
			}
			t.Fatalf("timed out after %s waiting for %s%s", timeout, what, more)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procStat is a process's state and parent, from /proc; ok is false when
// there is no such process.
func procStat(pid int) (state string, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(fields[1])
	return fields[0], ppid, true
}

// groupAlive reports whether any process of the group is running.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	// Signalable members may all be zombies, waiting for their parent.
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid && platform.ProcessAlive(pid) {
			return true
		}
	}
	return false
}

func cmdline(pid int) []string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// children lists this process's children, zombies included.
func children() map[int]bool {
	kids := map[int]bool{}
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok && ppid == self {
			kids[pid] = true
		}
	}
	return kids
}

// newChildren lists this process's children, zombies included, that were
// not there before.
func newChildren(before map[int]bool) []int {
	var kids []int
	for pid := range children() {
		if !before[pid] {
			kids = append(kids, pid)
		}
	}
	return kids
}

func describe(pids []int) []string {
	var out []string
	for _, pid := range pids {
		state, _, _ := procStat(pid)
		out = append(out, fmt.Sprintf("%d (%s) %q", pid, state, cmdline(pid)))
	}
	return out
}

// goroutineStacks returns the stack of every goroutine, by the header
// line that names it ("goroutine 7").
func goroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := goruntime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, " [")
		stacks[head] = g
	}
	return stacks
}

func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for id := range goroutineStacks() {
		ids[id] = true
	}
	return ids
}

// agentGoroutines are the goroutines started since before that run, or
// were started by, the agent's code (or the platform package's), this
// test's goroutines and the fake engine's aside.
func agentGoroutines(before map[string]bool) []string {
	var leaked []string
	for id, stack := range goroutineStacks() {
		if before[id] {
			continue
		}
		if strings.Contains(stack, "fluksio-worker/agent.") || strings.Contains(stack, "fluksio-worker/platform.") {
			leaked = append(leaked, stack)
		}
	}
	return leaked
}

func rawOf(ms []enginetest.Message) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, string(m.Raw))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
