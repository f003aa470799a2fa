package agent_test

// The agent's calls in this process, against the fake engine on loopback,
// with this test binary re-executed as the runner (agent/runner/runnertest):
// what a call's runner gets, what the engine is answered when calls are
// declined, queued, cancelled, drained, reloaded, stopped or lost, and what
// the worker says about it (metrics, status). session_test.go runs real
// Python through the embedded runtime; these need none.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner/runnertest"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

func TestMain(m *testing.M) {
	if runnertest.Enabled() {
		runnertest.Main()
	}
	// Runners inherit the worker's environment: started as this binary
	// with --python, they are the fake runner.
	os.Setenv(runnertest.EnvVar, "1")
	// Most of these tests wait: for a heartbeat, a paused engine, a runner
	// to exit. Four at a time rather than one per CPU, unless -parallel is
	// given, keeps `go test ./agent/...` under a minute on two cores.
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", strconv.Itoa(max(4, runtime.GOMAXPROCS(0))))
	}
	os.Exit(m.Run())
}

const fakeToken = "fake-session-token-0d4c21"

// fake is an Agent serving the fake engine, its runners this binary.
type fake struct {
	a        *agent.Agent
	eng      *enginetest.Engine
	wk       *enginetest.Worker
	served   chan error
	stateDir string
	log      *enginetest.Buffer
}

// serveFake starts an Agent with these extra flags; it returns once the
// engine welcomed it, unless opts make the engine refuse it.
func serveFake(t *testing.T, opts enginetest.Options, args ...string) *fake {
	t.Helper()
	return serveFakeWith(t, opts, func(*agent.Agent) {}, args...)
}

// serveFakeWith is serveFake with prepare called on the Agent before it
// serves.
func serveFakeWith(t *testing.T, opts enginetest.Options, prepare func(*agent.Agent), args ...string) *fake {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Tokens == nil {
		opts.Tokens = []string{fakeToken}
	}
	eng, err := enginetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	cfg, stateDir := loadConfig(t, append([]string{
		"--url", eng.AttachURL(), "--token", fakeToken, "--python", self, "--runtime", "embedded",
		"--warm", "0", "--cancel-grace", "500ms", "--state-dir", filepath.Join(t.TempDir(), "state"),
		"--log-level", "debug",
	}, args...))
	f := &fake{eng: eng, served: make(chan error, 1), stateDir: stateDir, log: &enginetest.Buffer{}}
	f.a = agent.New(cfg, logging.NewLogger(f.log, "text", "debug", fakeToken), self, stateDir)
	prepare(f.a)
	go func() { f.served <- f.a.Serve(context.Background()) }()
	t.Cleanup(func() {
		f.a.Stop()
		select {
		case err := <-f.served:
			f.served <- err
		case <-time.After(goneTimeout):
			t.Errorf("Serve did not return within %s of Stop", goneTimeout)
		}
		if t.Failed() {
			t.Logf("the worker's log:\n%s", f.log.String())
		}
	})
	if opts.Refuse == "" {
		f.wk = f.attach(t)
	}
	return f
}

// attach waits for the worker's next connection.
func (f *fake) attach(t *testing.T) *enginetest.Worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	wk, err := f.eng.NextWorker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return wk
}

// run sends a fake-runner call with these steps.
func (f *fake) run(t *testing.T, id string, steps ...map[string]any) *enginetest.Call {
	t.Helper()
	return f.runReq(t, map[string]any{"call_id": id, "steps": steps})
}

func (f *fake) runReq(t *testing.T, req map[string]any) *enginetest.Call {
	t.Helper()
	c, err := f.wk.Run(req)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// answer waits for a call's answer.
func answerOf(t *testing.T, c *enginetest.Call) enginetest.Message {
	t.Helper()
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatalf("call %s: %v; events %s", c.ID, err, rawOf(events))
	}
	return answer
}

// declined checks an answer is an error of typ whose message has want.
func declined(t *testing.T, m enginetest.Message, typ, want string) {
	t.Helper()
	if m.OK || m.Error == nil || m.Error.Type != typ || !strings.Contains(m.Error.Message, want) {
		t.Errorf("answer %s; want %s %q", m.Raw, typ, want)
	}
}

// nextEvent reads a call's frames up to the next event of kind, failing
// the test if the call answers first.
func nextEvent(t *testing.T, c *enginetest.Call, kind string) enginetest.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for {
		m, err := c.Next(ctx)
		if err != nil || m.IsAnswer() {
			t.Fatalf("call %s: no %s event: %s %v", c.ID, kind, m.Raw, err)
		}
		if m.Event == kind {
			return m
		}
	}
}

// started waits for a call's "started" event (the announce step) and
// returns the runner's pid.
func started(t *testing.T, c *enginetest.Call) int {
	t.Helper()
	var ev struct{ PID int }
	nextEvent(t, c, "started").Decode(&ev)
	return ev.PID
}

// served waits for Serve's result.
func (f *fake) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-f.served:
		f.served <- err
		return err
	case <-time.After(goneTimeout):
		t.Fatalf("Serve did not return within %s", goneTimeout)
		return nil
	}
}

// What a call's runner gets in its environment: the worker's own less its
// settings (the token only as FLUKSIO_ARTIFACT_TOKEN), the artifact
// endpoint and token, the request's env (JSON
// values as Python writes them), and the call's own directory.
func TestCallEnvironment(t *testing.T) {
	t.Setenv("FLUKSIO_WORKER_NAME", "not for node code")
	t.Setenv("FLUKSIO_WORKER_LABELS", "a,b")
	t.Setenv("FLUKSIO_WORKER_TOKEN", fakeToken) // the worker's own token, as a service gets it
	t.Setenv("FLUKSIO_ARTIFACT_TOKEN", "stale") // from whatever started the worker
	t.Setenv("CUDA_VISIBLE_DEVICES", "2,3")     // the worker's own devices
	t.Setenv("KEEP", "the worker's")
	f := serveFake(t, enginetest.Options{})
	names := []string{"FLUKSIO_ARTIFACT_URL", "FLUKSIO_ARTIFACT_TOKEN", "FLUKSIO_ARTIFACT_CACHE",
		"OMP_NUM_THREADS", "FLAG", "FLUKSIO_WORKER_NAME", "FLUKSIO_WORKER_LABELS", "FLUKSIO_WORKER_TOKEN", "FLUKSIO_CALL_DIR", "CUDA_VISIBLE_DEVICES", "KEEP"}
	answer := answerOf(t, f.runReq(t, map[string]any{
		"call_id": "env", "env": map[string]any{"OMP_NUM_THREADS": 4, "FLAG": true, "FLUKSIO_ARTIFACT_TOKEN": "forged", "CUDA_VISIBLE_DEVICES": "1,0,7"},
		"steps": []map[string]any{{"env": names}},
	}))
	var out struct {
		Outputs struct {
			Env     map[string]string
			Request map[string]any
		}
	}
	if err := answer.Decode(&out); err != nil {
		t.Fatal(err)
	}
	env := out.Outputs.Env
	if _, has := out.Outputs.Request["env"]; has {
		t.Errorf("the runner's request line still holds env: %v", out.Outputs.Request)
	}
	base := strings.TrimSuffix(strings.Replace(f.eng.AttachURL(), "ws://", "http://", 1), "/workers/attach")
	for name, want := range map[string]string{
		"FLUKSIO_ARTIFACT_URL":   base + "/artifacts",
		"FLUKSIO_ARTIFACT_CACHE": filepath.Join(f.stateDir, "artifacts"),
		"OMP_NUM_THREADS":        "4",
		"FLAG":                   "True",
		"FLUKSIO_WORKER_NAME":    "",
		"FLUKSIO_WORKER_LABELS":  "",
		"FLUKSIO_WORKER_TOKEN":   "",
		"KEEP":                   "the worker's",
		// Positions in the worker's own CUDA_VISIBLE_DEVICES; 7 is none.
		"CUDA_VISIBLE_DEVICES": "3,2,7",
		// The request's env comes last: the engine may set what it likes.
		"FLUKSIO_ARTIFACT_TOKEN": "forged",
	} {
		if env[name] != want {
			t.Errorf("%s=%q in the runner's environment; want %q", name, env[name], want)
		}
	}
	if !strings.HasPrefix(env["FLUKSIO_CALL_DIR"], filepath.Join(f.stateDir, "calls")+string(os.PathSeparator)) {
		t.Errorf("FLUKSIO_CALL_DIR=%q; want a directory under the state directory", env["FLUKSIO_CALL_DIR"])
	}
	// The next call gets none of the first one's env.
	answer = answerOf(t, f.run(t, "next", map[string]any{"env": names}))
	answer.Decode(&out)
	if env := out.Outputs.Env; env["FLUKSIO_ARTIFACT_TOKEN"] != fakeToken || env["OMP_NUM_THREADS"] != "" || env["CUDA_VISIBLE_DEVICES"] != "2,3" || env["FLUKSIO_WORKER_TOKEN"] != "" {
		t.Errorf("a call without env after one with it got %v; want the worker's token as FLUKSIO_ARTIFACT_TOKEN (not the stale one) and its devices, no OMP_NUM_THREADS, no FLUKSIO_WORKER_TOKEN", env)
	}
}

// Requests the worker cannot run are answered at once, and counted as
// invalid; messages it cannot use are skipped without taking the
// connection down.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--listen", "127.0.0.1:0")
	base := monitoring(t, f)
	for _, raw := range []string{"not json", `{"op":"run"}`, `{"op":"teleport","call_id":"t"}`, `{"op":"cancel","call_id":"nobody"}`} {
		if err := f.wk.Send(raw); err != nil {
			t.Fatal(err)
		}
	}
	declined(t, answerOf(t, f.runReq(t, map[string]any{"call_id": "badenv", "env": []int{1}})), protocol.TypeRemoteError, "env is not an object")
	started(t, f.run(t, "dup", map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000}))
	// The duplicate's frames and the first call's share the id: each
	// answer is read from a fresh registration of it.
	declined(t, answerOf(t, f.run(t, "dup")), protocol.TypeRemoteError, `call_id "dup" is already running`)
	cancelled := f.wk.Expect("dup")
	f.wk.Cancel("dup")
	declined(t, answerOf(t, cancelled), protocol.TypeNodeCancelled, "")
	// Still attached and serving.
	if answer := answerOf(t, f.run(t, "after")); !answer.OK {
		t.Errorf("a call after the bad requests answered %s", answer.Raw)
	}
	for _, want := range []string{"not a JSON object", "without call_id", "unknown op", "not running here"} {
		if !strings.Contains(f.log.String(), want) {
			t.Errorf("the log does not say %q", want)
		}
	}
	// The bad env and the duplicate; the cancelled call had started.
	if _, m := httpGet(t, base+"/metrics"); !strings.Contains(m, `fluksio_worker_calls_declined_total{reason="invalid"} 2`) ||
		!strings.Contains(m, `fluksio_worker_calls_declined_total{reason="cancelled"} 0`) {
		t.Errorf("/metrics does not count two invalid requests and nothing else:\n%s", m)
	}
}

// --parallel 1: calls wait for the slot in order; one cancelled while it
// waits is answered at once and never runs; a stop answers the rest.
func TestQueueAndStop(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1")
	first := f.run(t, "first", map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000})
	pid := started(t, first)
	second := f.run(t, "second")
	third := f.run(t, "third")
	var st status.Status
	eventually(t, goneTimeout, "the status file to count two waiting calls", func() bool {
		st, _ = status.Read(f.stateDir)
		return st.CallsQueued == 2 && st.CallsRunning == 1
	})
	f.wk.Cancel("second")
	declined(t, answerOf(t, second), protocol.TypeNodeCancelled, "cancelled before it started")
	f.a.Stop()
	declined(t, answerOf(t, first), protocol.TypeNodeCancelled, "the worker is stopping")
	declined(t, answerOf(t, third), protocol.TypeNodeCancelled, "the worker is stopping")
	if err := f.result(t); err != nil {
		t.Errorf("Serve after Stop: %v", err)
	}
	if platform.ProcessAlive(pid) {
		t.Errorf("the running call's runner %d outlived Serve", pid)
	}
}

// A drain lets the running call finish and declines new ones, counted
// as declined while draining.
func TestDrain(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--listen", "127.0.0.1:0")
	base := monitoring(t, f)
	running := f.run(t, "running", map[string]any{"announce": true}, map[string]any{"sleep_ms": 500})
	started(t, running)
	f.a.Drain()
	eventually(t, goneTimeout, "a new call to be declined", func() bool {
		m := answerOf(t, f.run(t, fmt.Sprintf("late-%d", time.Now().UnixNano())))
		return m.Error != nil && m.Error.Message == "the worker is draining"
	})
	if _, m := httpGet(t, base+"/metrics"); !strings.Contains(m, `fluksio_worker_calls_declined_total{reason="draining"} 1`) {
		t.Errorf("/metrics does not count the call declined while draining:\n%s", m)
	}
	if answer := answerOf(t, running); !answer.OK {
		t.Errorf("the call running at the drain answered %s; want it to finish", answer.Raw)
	}
	if err := f.result(t); err != nil {
		t.Errorf("Serve after a drain: %v", err)
	}
}

// TestMaxCalls: with --max-calls 3 the worker answers three calls, declines
// the fourth as a draining worker does, and exits 0 once the three are done.
func TestMaxCalls(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--max-calls", "3", "--parallel", "4")
	wk := f.wk
	var calls []*enginetest.Call
	for i := 1; i <= 4; i++ {
		calls = append(calls, run(t, wk, fmt.Sprintf("mc%d", i), step{"sleep_ms": 500}))
	}
	for i, c := range calls {
		answer, _ := wait(t, c)
		if i < 3 && !answer.OK {
			t.Errorf("call %s: %s; want ok", c.ID, answer.Raw)
		}
		if i == 3 && (answer.OK || answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the worker is draining") {
			t.Errorf("the fourth call: %s; want NodeCancelled, the worker is draining", answer.Raw)
		}
	}
	if err := f.result(t); err != nil {
		t.Errorf("Serve after --max-calls: %v; want nil (exit 0)", err)
	}
	if !strings.Contains(f.log.String(), "--max-calls") {
		t.Errorf("the log does not say why the worker stopped:\n%s", f.log.String())
	}
}

// TestMaxCallsCountsAnswersNotAttempts: a call that never got its answer
// (the connection was lost) leaves its place to another.
func TestMaxCallsCountsAnswersNotAttempts(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--max-calls", "1")
	wk := f.wk
	lost := run(t, wk, "lost", step{"announce": true}, step{"sleep_ms": 60000})
	if _, err := lost.Next(timeoutCtx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	wk.Drop()
	wk = f.attach(t)
	if answer, _ := wait(t, run(t, wk, "kept", step{"events": 1})); !answer.OK {
		t.Errorf("after a lost call, the one call --max-calls allows: %s", answer.Raw)
	}
	if err := f.result(t); err != nil {
		t.Errorf("Serve after --max-calls: %v; want nil (exit 0)", err)
	}
}

// A reload declines new calls, waits for the running one up to
// --reload-timeout, stops it then, and Serve returns ErrReload.
func TestReloadWaitsThenStops(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--reload-timeout", "3s")
	c := f.run(t, "long", map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000})
	started(t, c)
	f.a.Reload()
	f.a.Reload() // a second request while one waits changes nothing
	declined(t, answerOf(t, f.run(t, "new")), protocol.TypeNodeCancelled, "the worker is reloading")
	eventually(t, goneTimeout, "the worker to say it is reloading", func() bool {
		return strings.HasPrefix(f.a.Pulse(), "reloading, attached as")
	})
	declined(t, answerOf(t, c), protocol.TypeNodeCancelled, "--reload-timeout ran out")
	if err := f.result(t); !errors.Is(err, agent.ErrReload) {
		t.Errorf("Serve after a reload: %v; want ErrReload", err)
	}
}

// A stop during a reload wins: the worker exits without re-executing.
func TestStopOverrulesReload(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	c := f.run(t, "long", map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000})
	started(t, c)
	f.a.Reload()
	f.a.Stop()
	declined(t, answerOf(t, c), protocol.TypeNodeCancelled, "the worker is stopping")
	if err := f.result(t); err != nil {
		t.Errorf("Serve after a reload then a stop: %v; want nil", err)
	}
}

// Kill, a second stop signal, does not wait for --cancel-grace.
func TestKillAfterStop(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--cancel-grace", "10m")
	c := f.run(t, "stubborn", map[string]any{"ignore_term": true}, map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000})
	pid := started(t, c)
	f.a.Stop()
	f.a.Kill()
	f.result(t) // ten minutes of grace would time this out
	eventually(t, goneTimeout, "the killed runner to be gone", func() bool { return !platform.ProcessAlive(pid) })
}

// A lost connection stops its calls (nobody can hear their answers); the
// worker reattaches, healthy within --health-grace meanwhile, and counts
// the disconnect.
func TestLostConnection(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--listen", "127.0.0.1:0", "--parallel", "1")
	srv, err := f.a.ListenMonitoring()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := f.run(t, "lost", map[string]any{"announce": true}, map[string]any{"sleep_ms": 60000})
	pid := started(t, c)
	f.run(t, "waiting")
	f.wk.Drop()
	eventually(t, goneTimeout, "the lost call's runner to be stopped", func() bool { return !platform.ProcessAlive(pid) })
	if ok, reason := f.a.Health(); !ok {
		t.Errorf("Health() right after losing the engine: %q; want healthy within --health-grace", reason)
	}
	f.wk = f.attach(t)
	if answer := answerOf(t, f.run(t, "after")); !answer.OK {
		t.Errorf("a call after reattaching answered %s", answer.Raw)
	}
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"fluksio_worker_disconnects_total 1",
		"fluksio_worker_welcomes_total 2",
		`fluksio_worker_calls_finished_total{op="run",outcome="cancelled"} 1`,
		`fluksio_worker_calls_finished_total{op="run",outcome="ok"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	eventually(t, goneTimeout, "the status file to show the --listen address", func() bool {
		st, _ := status.Read(f.stateDir)
		return st.Listen == srv.Addr()
	})
}

// A refusal ends Serve with the engine's reason, and the status says so.
func TestRefusedWorker(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{Refuse: "this worker is banned"})
	err := f.result(t)
	var refused *protocol.RefusedError
	if !errors.As(err, &refused) || refused.Reason != "this worker is banned" {
		t.Fatalf("Serve of a refused worker: %v", err)
	}
	if st, _ := status.Read(f.stateDir); !strings.Contains(st.LastError, "this worker is banned") {
		t.Errorf("status %+v; want the refusal's reason", st)
	}
	if ok, reason := f.a.Health(); ok || !strings.Contains(reason, "banned") {
		t.Errorf("Health() = %v, %q; want unhealthy, with the reason", ok, reason)
	}
}

// --max-idle: a worker with nothing to run exits by itself.
func TestMaxIdle(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--max-idle", "500ms")
	answerOf(t, f.run(t, "one"))
	if err := f.result(t); err != nil {
		t.Errorf("Serve after --max-idle: %v", err)
	}
	select {
	case <-f.wk.Done():
	case <-time.After(goneTimeout):
		t.Fatal("the idle worker left its connection open")
	}
}

// --max-idle counts while the worker cannot reach the engine too: a batch
// job whose engine is gone gives its node back, and says it never
// attached (exit 4), not that it did its work.
func TestMaxIdleWhileDisconnected(t *testing.T) {
	t.Parallel()
	// Long enough for a second attempt on a loaded machine, where the
	// first hello (its venv digest) alone can take seconds.
	const maxIdle = 6 * time.Second
	d, err := enginetest.StartDoorman(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	self, _ := os.Executable()
	cfg, stateDir := loadConfig(t, []string{"--url", d.AttachURL(), "--token", fakeToken, "--python", self,
		"--runtime", "embedded", "--state-dir", t.TempDir(), "--max-idle", maxIdle.String()})
	a := agent.New(cfg, logging.NewLogger(io.Discard, "text", "info", fakeToken), self, stateDir)
	start := time.Now()
	served := make(chan error, 1)
	go func() { served <- a.Serve(context.Background()) }()
	select {
	case err := <-served:
		var never *agent.NeverAttachedError
		if !errors.As(err, &never) || never.MaxIdle != maxIdle {
			t.Errorf("Serve of an idle worker that cannot attach: %v; want a NeverAttachedError", err)
		}
	case <-time.After(goneTimeout):
		a.Stop()
		t.Fatalf("the worker did not give up after --max-idle %s", maxIdle)
	}
	if took := time.Since(start); took < maxIdle-500*time.Millisecond {
		t.Errorf("Serve returned after %s, before --max-idle %s", took, maxIdle)
	}
	// Retrying while idle: a second attempt, unless the first came so late
	// (a loaded machine's first hello) that no retry was due before
	// --max-idle; the first retry comes within 2 s.
	attempts := d.Attempts()
	switch {
	case len(attempts) == 0:
		t.Error("no attach attempt before --max-idle")
	case len(attempts) == 1 && attempts[0].At.Before(start.Add(maxIdle-3*time.Second)):
		t.Errorf("one attach attempt, %s after the start: the worker was not retrying while idle",
			attempts[0].At.Sub(start).Round(time.Millisecond))
	}
}

func TestRunCommandWithoutServing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--help"}, config.ExitOK, "Usage: fluksio-worker [run]"},
		{[]string{"--version"}, config.ExitOK, "fluksio-worker " + agent.Version},
		{[]string{"--parallel", "zero"}, config.ExitUsage, "--parallel"},
		{[]string{"--url", "wss://e.example.com/api/v1/workers/attach", "--token", "t", "--python", "/nonexistent/python3"}, config.ExitUsage, "/nonexistent/python3"},
	} {
		var stdout, stderr strings.Builder
		code := agent.RunCommand(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("run %q: exit %d, output %q; want %d and %q", tc.args, code, stdout.String()+stderr.String(), tc.code, tc.out)
		}
	}
}

// `run` in this process until its context ends: it attaches, serves a
// call and exits 0.
func TestRunCommandServes(t *testing.T) {
	self, _ := os.Executable()
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{fakeToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr enginetest.Buffer
	code := make(chan int, 1)
	go func() {
		code <- agent.RunCommand(ctx, []string{"--url", eng.AttachURL(), "--token", fakeToken, "--python", self,
			"--runtime", "embedded", "--warm", "0", "--state-dir", t.TempDir(), "--containment", "subreaper", "--listen", "127.0.0.1:0"},
			io.Discard, &stderr)
	}()
	wctx, wcancel := context.WithTimeout(ctx, attachTimeout)
	defer wcancel()
	wk, err := eng.NextWorker(wctx)
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, stderr.String())
	}
	c, _ := wk.Run(map[string]any{"call_id": "via-run"})
	if answer, _, err := c.WaitTimeout(callTimeout); err != nil || !answer.OK {
		t.Errorf("answer %s, %v", answer.Raw, err)
	}
	cancel()
	select {
	case got := <-code:
		if got != config.ExitOK {
			t.Errorf("run exited %d; log:\n%s", got, stderr.String())
		}
	case <-time.After(goneTimeout):
		t.Fatal("run did not return after its context ended")
	}
	if !strings.Contains(stderr.String(), "serving /metrics, /healthz and /livez") {
		t.Errorf("run did not serve --listen:\n%s", stderr.String())
	}
}

// inventory prints the hello this worker would send: flags first, then
// what the batch scheduler granted.
func TestInventoryCommand(t *testing.T) {
	t.Setenv("SLURM_CPUS_ON_NODE", "12")
	t.Setenv("SLURM_JOB_GPUS", "0,1")
	self, _ := os.Executable()
	var stdout, stderr strings.Builder
	code := agent.InventoryCommand(context.Background(), []string{"--python", self, "--ram-mb", "2048", "--labels", "gpu,a100", "--name", "n1"}, &stdout, &stderr)
	if code != config.ExitOK {
		t.Fatalf("inventory exited %d: %s", code, stderr.String())
	}
	var hello struct {
		Op        string   `json:"op"`
		Protocol  int      `json:"protocol"`
		Name      string   `json:"name"`
		Labels    []string `json:"labels"`
		Python    string   `json:"python"`
		Inventory struct {
			CPUs, GPUs int
			RAMMB      int `json:"ram_mb"`
		} `json:"inventory"`
		VenvDigest string `json:"venv_digest"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &hello); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout.String())
	}
	inv := hello.Inventory
	if hello.Name != "n1" || strings.Join(hello.Labels, ",") != "gpu,a100" || hello.Python != self ||
		inv.CPUs != 12 || inv.GPUs != 2 || inv.RAMMB != 2048 || len(hello.VenvDigest) != 16 || hello.Op != "hello" || hello.Protocol != protocol.Version ||
		strings.Contains(stdout.String(), "containment") {
		t.Errorf("inventory printed %s", stdout.String())
	}
	if code := agent.InventoryCommand(context.Background(), []string{"--bogus"}, &stdout, &stderr); code != config.ExitUsage {
		t.Errorf("inventory --bogus exited %d", code)
	}
}

func TestCheckAttach(t *testing.T) {
	t.Parallel()
	self, _ := os.Executable()
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{fakeToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	cfg := config.DefaultConfig()
	cfg.URL, cfg.Token, cfg.Python = eng.AttachURL(), fakeToken, self
	if err := agent.CheckAttach(context.Background(), cfg); err != nil {
		t.Errorf("CheckAttach: %v", err)
	}
	cfg.Token = "wrong"
	var refused *protocol.RefusedError
	if err := agent.CheckAttach(context.Background(), cfg); !errors.As(err, &refused) {
		t.Errorf("CheckAttach with a wrong token: %v; want a refusal", err)
	}
}

// /healthz is 200 once attached, 503 once the engine has been gone past
// --health-grace, 200 again when it is back; /metrics follows the same
// connection.
func TestHealthFollowsTheEngine(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--listen", "127.0.0.1:0", "--health-grace", "1s", "--name", "h-box")
	base := monitoring(t, f)
	var body string
	healthIs := func(want int) func() bool {
		return func() bool {
			var code int
			code, body = httpGet(t, base+"/healthz")
			return code == want
		}
	}
	eventually(t, goneTimeout, "/healthz to be 200 once attached", healthIs(http.StatusOK))
	if !strings.Contains(body, `attached as "h-box" to `+f.eng.AttachURL()) || strings.Count(body, "\n") != 1 {
		t.Errorf("attached: %q; want one line naming the worker and the engine", body)
	}
	restarted := make(chan error, 1)
	go func() { restarted <- f.eng.Restart(6 * time.Second) }()
	eventually(t, goneTimeout, "/healthz to turn 503 with the engine gone", healthIs(http.StatusServiceUnavailable))
	if !strings.Contains(body, "not attached to "+f.eng.AttachURL()) || !strings.Contains(body, "--health-grace") {
		t.Errorf("with the engine gone /healthz says %q; want why, with the engine and the grace", body)
	}
	if _, m := httpGet(t, base+"/metrics"); !strings.Contains(m, "fluksio_worker_connected 0") || !strings.Contains(m, "fluksio_worker_disconnects_total 1") {
		t.Errorf("with the engine gone /metrics does not say disconnected once:\n%s", m)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	f.attach(t)
	eventually(t, goneTimeout, "/healthz to be 200 again", healthIs(http.StatusOK))
	if _, m := httpGet(t, base+"/metrics"); !strings.Contains(m, "fluksio_worker_connected 1") || !strings.Contains(m, "fluksio_worker_welcomes_total 2") {
		t.Errorf("back: /metrics does not say connected, welcomed twice:\n%s", m)
	}
}

// httpGet fetches url; no answer may carry the token.
// monitoring serves /metrics, /healthz and /livez for f's worker (started
// with --listen) until the test ends, and returns their base URL.
func monitoring(t *testing.T, f *fake) string {
	t.Helper()
	srv, err := f.a.ListenMonitoring()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return "http://" + srv.Addr()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(b), fakeToken) {
		t.Errorf("%s shows the token", url)
	}
	return resp.StatusCode, string(b)
}

// A worker that cannot serve what it was asked to says so and exits 2,
// rather than running unwatched.
func TestListenOnATakenAddressIsAUsageError(t *testing.T) {
	t.Parallel()
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{fakeToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	self, _ := os.Executable()
	var out enginetest.Buffer
	// The engine's own address is surely taken.
	code := agent.RunCommand(context.Background(), []string{"--url", eng.AttachURL(), "--token", fakeToken, "--python", self,
		"--runtime", "embedded", "--state-dir", t.TempDir(), "--listen", eng.Addr()}, &out, &out)
	if code != config.ExitUsage || !strings.Contains(out.String(), "--listen "+eng.Addr()) {
		t.Errorf("exit %d; want 2 and the address named:\n%s", code, out.String())
	}
}

// loadConfig is what run does with its arguments, with nothing of the
// caller's environment: load, resolve, find the state directory.
func loadConfig(t *testing.T, args []string) (config.Config, string) {
	t.Helper()
	noEnv := func(string) string { return "" }
	cfg, err := config.Load(args, noEnv)
	if err == nil {
		err = cfg.Resolve()
	}
	if err != nil {
		t.Fatalf("the configuration: %v", err)
	}
	stateDir, err := config.ResolveStateDir(cfg, noEnv)
	if err != nil {
		t.Fatalf("the state directory: %v", err)
	}
	return cfg, stateDir
}
