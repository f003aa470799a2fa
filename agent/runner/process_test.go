//go:build linux

package runner

// The runner's process lifecycle, driven through Pool.Start, a cancel with
// its *StopError, End and the warm pool, against real processes: this test
// binary re-executes itself as the runner (runnertest's fake runner), a
// node that can ignore SIGTERM, fork a grandchild that holds stdout, or
// start a process in a session of its own.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner/runnertest"
	"github.com/fluksio/fluksio-worker/platform"
)

func TestMain(m *testing.M) {
	if runnertest.Enabled() {
		runnertest.Main()
	}
	if os.Getenv(cloneIntoEnv) == "1" && len(os.Args) == 2 && os.Args[1] == "--version" {
		// Containment's probe, which starts this executable straight into
		// a cgroup with --version, as the worker's own: it may.
		os.Exit(0)
	}
	if os.Getenv(containedEnv) == "1" {
		// Not passed on: containment set up here starts this executable
		// (a probe), which must not set it up again.
		os.Unsetenv(containedEnv)
		containedChild = true
		SetupContainment(slog.New(slog.NewTextHandler(os.Stderr, nil)), "cgroup")
		if err := setTestLimits(); err != nil {
			fmt.Fprintln(os.Stderr, "setting the test's call limits:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// Generous bounds for a loaded machine: a wait only ends early.
const (
	waitLong  = 30 * time.Second
	testGrace = 300 * time.Millisecond
)

// rig is a Pool whose runners are this test binary, and what they did.
type rig struct {
	t       *testing.T
	pool    *Pool
	cfg     Config
	log     *enginetest.Buffer
	runtime string // the "runtime" file the runner is started with
}

// newRig makes a pool; change adjusts its configuration first.
func newRig(t *testing.T, change func(*Config)) *rig {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &rig{t: t, log: &enginetest.Buffer{}, runtime: filepath.Join(dir, "runtime.py")}
	if err := os.WriteFile(r.runtime, []byte("# the fake runner ignores this\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.cfg = Config{
		Python:      self,
		StateDir:    filepath.Join(dir, "state"),
		BaseEnv:     []string{runnertest.EnvVar + "=1", "PATH=" + os.Getenv("PATH"), "BASE_ONLY=base", "SHARED=base"},
		CancelGrace: testGrace,
		MaxLine:     1 << 20,
		Log:         slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	r.open(change)
	return r
}

// open makes the rig's pool once change adjusted its configuration, and
// closes it with the test.
func (r *rig) open(change func(*Config)) {
	if change != nil {
		change(&r.cfg)
	}
	r.pool = NewPool(r.cfg)
	r.t.Cleanup(func() {
		r.pool.Close()
		if r.t.Failed() {
			r.t.Logf("the runner's log:\n%s", r.log.String())
		}
	})
}

// call is one started runner and the events it sent.
type call struct {
	*Process
	id     string
	events chan []byte
}

// start starts a runner for a request with these steps and env.
func (r *rig) start(ctx context.Context, id string, env []string, steps ...map[string]any) (*call, error) {
	r.t.Helper()
	req, _ := json.Marshal(map[string]any{"call_id": id, "steps": steps})
	c := &call{id: id, events: make(chan []byte, 1024)}
	p, err := r.pool.Start(ctx, Spec{
		Runtime: Runtime{Path: r.runtime, Embedded: true},
		Env:     env,
		Request: append(req, '\n'),
		Log:     r.cfg.Log.With("call_id", id),
		Send:    func(msg []byte) { c.events <- append([]byte(nil), msg...); frame.Put(msg) },
	})
	c.Process = p
	return c, err
}

// mustStart starts a runner that must start, and ends it with the test.
func (r *rig) mustStart(ctx context.Context, id string, env []string, steps ...map[string]any) *call {
	r.t.Helper()
	c, err := r.start(ctx, id, env, steps...)
	if err != nil {
		r.t.Fatalf("Start: %v", err)
	}
	return c
}

// output waits for how the runner's stdout ended.
func (c *call) output(t *testing.T) Output {
	t.Helper()
	select {
	case out := <-c.Output():
		return out
	case <-time.After(waitLong):
		t.Fatalf("call %s: the runner's output did not end within %s", c.id, waitLong)
		return Output{}
	}
}

// end calls End, failing the test if it does not return, and returns
// what End says the runner cost.
func (c *call) end(t *testing.T, answered bool) Usage {
	t.Helper()
	done := make(chan Usage, 1)
	go func() { done <- c.End(answered)() }()
	select {
	case u := <-done:
		return u
	case <-time.After(waitLong):
		t.Fatalf("call %s: End did not return within %s", c.id, waitLong)
		return Usage{}
	}
}

// event waits for the next event frame of kind and decodes it.
func (c *call) event(t *testing.T, kind string) map[string]any {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		select {
		case frame := <-c.events:
			var ev map[string]any
			if err := json.Unmarshal(frame, &ev); err != nil {
				t.Fatalf("event %q is not JSON: %v", frame, err)
			}
			if ev["event"] == kind {
				return ev
			}
		case <-deadline:
			t.Fatalf("call %s: no %q event within %s", c.id, kind, waitLong)
		}
	}
}

// answer decodes an answer line.
func answer(t *testing.T, out Output) map[string]any {
	t.Helper()
	if out.Answer == nil {
		t.Fatalf("no answer; output ended with %v", out.Err)
	}
	var a map[string]any
	if err := json.Unmarshal(out.Answer, &a); err != nil {
		t.Fatalf("answer %q: %v", out.Answer, err)
	}
	return a
}

// pidOf reads an int from a decoded object.
func pidOf(m map[string]any, key string) int {
	n, _ := m[key].(float64)
	return int(n)
}

// callDirs lists the call directories in the state directory, but for
// those of boxes made ahead: nothing ran in them. It waits for the work the
// pool does in the background first (a call's cleanup, a box being made),
// so it must not be called while a call ends.
func (r *rig) callDirs() []string {
	r.pool.behind.Wait()
	ahead := map[string]bool{}
	r.pool.boxes.mu.Lock()
	for _, m := range r.pool.boxes.ready {
		ahead[filepath.Base(m.dir.path)] = true
	}
	r.pool.boxes.mu.Unlock()
	entries, _ := os.ReadDir(filepath.Join(r.cfg.StateDir, callDirsName))
	var names []string
	for _, e := range entries {
		if !ahead[e.Name()] {
			names = append(names, e.Name())
		}
	}
	return names
}

// gone fails the test unless none of pids is running.
func gone(t *testing.T, what string, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		if pid > 0 && platform.ProcessAlive(pid) {
			t.Errorf("%s: process %d still runs", what, pid)
		}
	}
}

// killLater makes sure a process the test started does not outlive it,
// whatever the code under test did.
func killLater(t *testing.T, pids ...int) {
	t.Cleanup(func() {
		for _, pid := range pids {
			if pid > 0 && platform.ProcessAlive(pid) {
				p, _ := os.FindProcess(pid)
				p.Kill()
			}
		}
	})
}

func TestRunnerAnswersAndRelaysItsOutput(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	c := r.mustStart(context.Background(), "c1", nil,
		map[string]any{"events": 3},
		map[string]any{"raw": "this is not JSON"},
		map[string]any{"stderr": "hello from the node"})
	out := c.output(t)
	a := answer(t, out)
	if a["ok"] != true || a["call_id"] != "c1" {
		t.Errorf("answer %s; want ok for c1", out.Answer)
	}
	for i := range 3 {
		ev := c.event(t, "stream")
		if ev["call_id"] != "c1" || ev["values"].(map[string]any)["i"] != float64(i) {
			t.Errorf("event %d is %v", i, ev)
		}
	}
	select {
	case frame := <-c.events:
		t.Errorf("a line that is not a JSON object was sent to the engine: %q", frame)
	default:
	}
	dirs := r.callDirs()
	if len(dirs) != 1 {
		t.Errorf("call directories while the call runs: %v; want one", dirs)
	}
	u := c.end(t, true)
	gone(t, "after End", pidOf(a["outputs"].(map[string]any), "pid"))
	if u.Wall <= 0 || u.PeakRSSByte <= 0 {
		t.Errorf("End says the runner cost %+v; want its wall time and peak memory", u)
	}
	if dirs := r.callDirs(); len(dirs) != 0 {
		t.Errorf("End left call directories behind: %v", dirs)
	}
	log := r.log.String()
	for _, want := range []string{"hello from the node", "this is not JSON"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
}

// The runner's environment: the worker's own, then the request's (which
// wins), then what the worker sets for the call, which a request cannot
// override.
func TestRunnerEnvironment(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	c := r.mustStart(context.Background(), "env", []string{"SHARED=request", "REQUEST_ONLY=1", "FLUKSIO_CALL_DIR=/elsewhere"},
		map[string]any{"env": []string{"BASE_ONLY", "SHARED", "REQUEST_ONLY", "FLUKSIO_CALL_DIR", "FLUKSIO_CANCEL_GRACE", cookieEnv}})
	out := c.output(t)
	env, _ := answer(t, out)["outputs"].(map[string]any)["env"].(map[string]any)
	c.end(t, true)
	dirs := filepath.Join(r.cfg.StateDir, callDirsName) + string(os.PathSeparator)
	for name, ok := range map[string]bool{
		"BASE_ONLY":            env["BASE_ONLY"] == "base",
		"SHARED":               env["SHARED"] == "request",
		"REQUEST_ONLY":         env["REQUEST_ONLY"] == "1",
		"FLUKSIO_CALL_DIR":     strings.HasPrefix(fmt.Sprint(env["FLUKSIO_CALL_DIR"]), dirs),
		"FLUKSIO_CANCEL_GRACE": env["FLUKSIO_CANCEL_GRACE"] == "0.3",
		cookieEnv:              regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(fmt.Sprint(env[cookieEnv])),
	} {
		if !ok {
			t.Errorf("%s=%v in the runner's environment", name, env[name])
		}
	}
}

// A cancel with a *StopError: SIGTERM, then SIGKILL after the grace for a
// runner that ignores SIGTERM, and its grandchild with it. The output ends
// without an answer, and Stopped gives the reason back.
func TestCancelStopsARunnerThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	c := r.mustStart(ctx, "stubborn", nil,
		map[string]any{"ignore_term": true},
		map[string]any{"announce": true},
		map[string]any{"grandchild": true},
		map[string]any{"sleep_ms": 60000})
	pid := pidOf(c.event(t, "started"), "pid")
	grandchild := pidOf(c.event(t, "grandchild"), "pid")
	killLater(t, pid, grandchild)
	cancel(&StopError{Reason: "the engine changed its mind"})
	out := c.output(t)
	if out.Answer != nil || out.Err != nil {
		t.Errorf("a killed runner's output ended with answer %q, error %v; want neither", out.Answer, out.Err)
	}
	stop := Stopped(ctx)
	if stop == nil || stop.Error() != "the engine changed its mind" {
		t.Errorf("Stopped = %v; want the reason the call was cancelled with", stop)
	}
	c.end(t, false)
	gone(t, "after a cancel", pid, grandchild)
	if !strings.Contains(r.log.String(), "did not stop within --cancel-grace") {
		t.Error("the log does not say the runner was killed after --cancel-grace")
	}
	if dirs := r.callDirs(); len(dirs) != 0 {
		t.Errorf("call directories left: %v", dirs)
	}
}

// A runner that answers SIGTERM (the runtime answers NodeCancelled) has
// its answer delivered, and is not killed.
func TestCancelLetsTheRunnerAnswer(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.CancelGrace = time.Minute })
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	c := r.mustStart(ctx, "polite", nil,
		map[string]any{"on_term_answer": true},
		map[string]any{"announce": true},
		map[string]any{"sleep_ms": 60000})
	pid := pidOf(c.event(t, "started"), "pid")
	killLater(t, pid)
	cancel(&StopError{})
	a := answer(t, c.output(t))
	if e, _ := a["error"].(map[string]any); e["type"] != protocol.TypeNodeCancelled {
		t.Errorf("answer %v; want the runner's NodeCancelled", a)
	}
	c.end(t, true)
	gone(t, "after its answer", pid)
	if strings.Contains(r.log.String(), "did not stop within --cancel-grace") {
		t.Error("a runner that stopped on SIGTERM was killed")
	}
}

// A grandchild that inherited stdout (a forked data loader) does not keep
// the call open, and does not outlive it.
func TestGrandchildHoldingStdoutDoesNotHoldTheCall(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	c := r.mustStart(context.Background(), "fork", nil, map[string]any{"grandchild": true})
	grandchild := pidOf(c.event(t, "grandchild"), "pid")
	killLater(t, grandchild)
	out := c.output(t)
	answer(t, out)
	c.end(t, true)
	gone(t, "the grandchild after End", grandchild)
}

// A process that left the call's process group and session (setsid),
// ignores SIGTERM and holds the pipes is found by its cookie and killed.
func TestProcessInItsOwnSessionIsSwept(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	c := r.mustStart(context.Background(), "escape", nil, map[string]any{"setsid": true})
	escaped := pidOf(c.event(t, "setsid"), "pid")
	killLater(t, escaped)
	if sid, _ := unix.Getsid(escaped); sid != escaped {
		t.Fatalf("the helper %d is in session %d; want a session of its own", escaped, sid)
	}
	answer(t, c.output(t))
	c.end(t, true)
	gone(t, "the process in its own session after End", escaped)
}

func TestDeathMessage(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	for _, tc := range []struct {
		step map[string]any
		want string
	}{
		// Each starts with the reference's words, then says why; a
		// SIGKILL the worker did not send is not blamed on the OOM killer
		// when no memory cgroup counted a kill.
		{map[string]any{"exit": 3}, "the node process stopped: exited with code 3 without answering"},
		{map[string]any{"kill_self": true}, "the node process stopped: killed by SIGKILL that the worker did not send"},
		{map[string]any{"no_answer": true}, protocol.MsgNodeStopped},
	} {
		c := r.mustStart(context.Background(), "die", nil, tc.step)
		out := c.output(t)
		if out.Answer != nil {
			t.Errorf("%v: answered %q", tc.step, out.Answer)
		}
		if got := c.DeathMessage(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v: DeathMessage() = %q; want %q…", tc.step, got, tc.want)
		}
		c.end(t, false)
	}
}

// Kill, for a worker told twice to stop, does not wait for the grace.
func TestKillDoesNotWaitForTheGrace(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.CancelGrace = 10 * time.Minute })
	c := r.mustStart(context.Background(), "kill", nil,
		map[string]any{"ignore_term": true}, map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000})
	pid := pidOf(c.event(t, "started"), "pid")
	killLater(t, pid)
	c.Kill()
	c.output(t) // ten minutes of grace would time this out
	if got := c.DeathMessage(); !strings.Contains(got, "SIGKILL") {
		t.Errorf("DeathMessage() = %q after Kill", got)
	}
	c.end(t, false)
	gone(t, "after Kill", pid)
}

func TestLineOverMaxLine(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.MaxLine = 1024 })
	c := r.mustStart(context.Background(), "long", nil, map[string]any{"raw": strings.Repeat("x", 5000)}, map[string]any{"sleep_ms": 60000})
	out := c.output(t)
	var tooLong *lineTooLongError
	if !errors.As(out.Err, &tooLong) || out.Answer != nil {
		t.Errorf("output ended with %q, %v; want a line-too-long error", out.Answer, out.Err)
	}
	c.end(t, false)
}

// A call stopped before its runner starts starts nothing, and says why.
func TestStartAfterAStop(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(&StopError{Reason: "the worker is stopping"})
	_, err := r.start(ctx, "late", nil)
	var stop *StopError
	if !errors.As(err, &stop) || stop.Reason != "the worker is stopping" {
		t.Errorf("Start after a stop: %v; want its *StopError", err)
	}
	if dirs := r.callDirs(); len(dirs) != 0 {
		t.Errorf("a call stopped before it started made %v", dirs)
	}
	// A context cancelled without a *StopError is a stop without reason.
	plain, cancelPlain := context.WithCancel(context.Background())
	if Stopped(plain) != nil {
		t.Error("Stopped of a live context is not nil")
	}
	cancelPlain()
	if got := Stopped(plain); got == nil || got.Error() != protocol.MsgNodeStopped {
		t.Errorf("Stopped of a plainly cancelled context = %v; want %q", got, protocol.MsgNodeStopped)
	}
}

func TestStartWithoutTheInterpreter(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.Python = "/nonexistent/python3" })
	_, err := r.start(context.Background(), "nopython", nil)
	if err == nil || !strings.Contains(err.Error(), "starting /nonexistent/python3") {
		t.Errorf("Start without the interpreter: %v", err)
	}
	if dirs := r.callDirs(); len(dirs) != 0 {
		t.Errorf("a runner that could not start left %v", dirs)
	}
}

func TestUnwritableStateDir(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) { c.StateDir = "/proc/self/no-such-state" })
	_, err := r.start(context.Background(), "nostate", nil)
	if err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("Start with an unwritable state directory: %v; want it to name --state-dir", err)
	}
}

// TestRunnersStartFromSourceOnceTheInterpreterChanged: bytecode is for the
// interpreter file that compiled it; once that file is another (python3
// moved to another version while the worker runs), runners start from the
// runtime's source, which any version runs, and the log says so once.
func TestRunnersStartFromSourceOnceTheInterpreterChanged(t *testing.T) {
	dir := t.TempDir()
	python := filepath.Join(dir, "python3")
	for _, name := range []string{"python3.11", "python3.12"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n# "+name+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("python3.11", python); err != nil {
		t.Fatal(err)
	}
	compiledBy, err := os.Stat(python)
	if err != nil {
		t.Fatal(err)
	}
	interpreterChanged = sync.Once{} // said once a process; once in this test
	var logs bytes.Buffer
	cfg := &Config{Python: python, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	rt := Runtime{Path: "/state/runtime/x.py", Bytecode: "/state/runtime/__pycache__/x.cpython-311.pyc", CompiledBy: compiledBy, Embedded: true}
	if got := cfg.script(rt); got != rt.Bytecode {
		t.Errorf("with the interpreter that compiled it: runs %q, want %q", got, rt.Bytecode)
	}
	// The link now names another version.
	if err := os.Remove(python); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("python3.12", python); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := cfg.script(rt); got != rt.Path {
			t.Errorf("after the interpreter changed: runs %q, want the source %q", got, rt.Path)
		}
	}
	if n := strings.Count(logs.String(), "interpreter changed"); n != 1 {
		t.Errorf("the change was logged %d times, want once: %s", n, logs.String())
	}
	if got := cfg.script(Runtime{Path: rt.Path}); got != rt.Path {
		t.Errorf("without bytecode: runs %q", got)
	}
}
