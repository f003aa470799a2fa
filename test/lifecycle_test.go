package test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// pidsOf reads the runner and grandchild pids from a call's events.
func pidsOf(t *testing.T, c *enginetest.Call) (runner, grandchild int) {
	t.Helper()
	for runner == 0 || grandchild == 0 {
		m, err := c.Next(timeoutCtx(t, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		switch m.Event {
		case "started":
			runner = intField(t, m, "pid")
		case "grandchild":
			grandchild = intField(t, m, "pid")
		}
	}
	return runner, grandchild
}

func TestMissingPythonIsAUsageError(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--python", "/nonexistent/python3")
	if code := w.wait(30 * time.Second); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if !strings.Contains(w.logs.String(), "--python /nonexistent/python3") {
		t.Errorf("log does not say which Python is missing:\n%s", w.logs.String())
	}
	w = startBinary(t, nil, "run", "--url", eng.AttachURL())
	if code := w.wait(30 * time.Second); code != 2 || !strings.Contains(w.logs.String(), "token is required") {
		t.Fatalf("no token: exit %d, log %s", code, w.logs.String())
	}
	// https://engine is the engine's web address, completed to wss://; a
	// scheme that is neither is the bad URL.
	w = startBinary(t, nil, "--url", "ftp://engine", "--token-file", "/nonexistent")
	if code := w.wait(30 * time.Second); code != 2 || !strings.Contains(w.logs.String(), "scheme must be wss://") {
		t.Fatalf("bad url: exit %d, log %s", code, w.logs.String())
	}
}

func TestRefusalExitsOne(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{Refuse: "worker pool is full"})
	w := startWorker(t, eng, nil)
	if code := w.wait(30 * time.Second); code != 1 {
		t.Fatalf("refused: exit %d, want 1", code)
	}
	if !strings.Contains(w.logs.String(), "worker pool is full") {
		t.Errorf("the engine's reason is not in the log:\n%s", w.logs.String())
	}
	if n := len(eng.Hellos()); n != 1 {
		t.Errorf("the worker said hello %d times; a refusal must not be retried", n)
	}
	saidLast(t, w, `level=ERROR msg=exiting reason="refused by the engine" exit_code=1`)
}

// saidLast checks the worker's last log line: why it exits, and its code.
func saidLast(t *testing.T, w *worker, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(w.logs.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, want) {
		t.Errorf("the worker's last log line is %q; want it to say %s", last, want)
	}
}

func TestWrongTokenExitsOne(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{Tokens: []string{"the-right-token"}})
	w := startWorker(t, eng, nil)
	if code := w.wait(30 * time.Second); code != 1 {
		t.Fatalf("401: exit %d, want 1", code)
	}
	if logs := w.logs.String(); !strings.Contains(logs, "401") || strings.Contains(logs, testToken) {
		t.Errorf("log should name the 401 and never the token:\n%s", logs)
	}
}

func TestIdleExitsZero(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--max-idle", "2")
	wk := attach(t, eng)
	// A call running longer than --max-idle is not idleness.
	answer, _ := wait(t, run(t, wk, "i1", step{"sleep_ms": 3000}))
	if !answer.OK {
		t.Fatal(string(answer.Raw))
	}
	ended := time.Now()
	if code := w.wait(20 * time.Second); code != 0 {
		t.Fatalf("idle exit %d, want 0", code)
	}
	if idle := time.Since(ended); idle < 1500*time.Millisecond {
		t.Errorf("exited %s after the last call, before --max-idle 2s", idle)
	}
	select {
	case <-wk.Done():
	case <-time.After(5 * time.Second):
		t.Error("the connection was not closed")
	}
}

func TestSIGTERMStopsRunningCalls(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "2", "--cancel-grace", "1s")
	wk := attach(t, eng)
	a := run(t, wk, "t1", step{"announce": true}, step{"grandchild": true}, step{"sleep_ms": 60000})
	b := run(t, wk, "t2", step{"ignore_term": true}, step{"announce": true}, step{"grandchild": true}, step{"sleep_ms": 60000})
	r1, g1 := pidsOf(t, a)
	r2, g2 := pidsOf(t, b)
	w.signal(syscall.SIGTERM)
	for _, c := range []*enginetest.Call{a, b} {
		answer, _ := wait(t, c)
		if answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the worker is stopping" {
			t.Errorf("%s answered %s", c.ID, answer.Raw)
		}
	}
	if code := w.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	saidLast(t, w, `msg=exiting reason="SIGTERM: stopped" exit_code=0`)
	for _, pid := range []int{r1, g1, r2, g2} {
		if platform.ProcessAlive(pid) {
			t.Errorf("process %d outlived the worker", pid)
		}
	}
}

func TestSecondSignalStopsAtOnce(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--cancel-grace", "60s")
	wk := attach(t, eng)
	c := run(t, wk, "s1", step{"ignore_term": true}, step{"announce": true}, step{"sleep_ms": 60000})
	runner := runnerPID(t, c)
	w.signal(syscall.SIGINT)
	// The second signal must come after the first was taken as a stop.
	eventually(t, 10*time.Second, "the worker to say it is stopping", func() bool {
		return strings.Contains(w.logs.String(), "stopping")
	})
	start := time.Now()
	w.signal(syscall.SIGINT)
	if code := w.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Not the 60 s --cancel-grace the first signal gave the call.
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("second signal took %s", took)
	}
	// Killed calls may still log as the process exits: not the last line.
	if want := `msg=exiting reason="SIGINT twice: running calls killed" exit_code=0`; !strings.Contains(w.logs.String(), want) {
		t.Errorf("the worker's log does not say %s", want)
	}
	eventually(t, 5*time.Second, "the runner to be killed", func() bool { return !platform.ProcessAlive(runner) })
}

// runnerPID reads the runner's pid from its "started" event.
func runnerPID(t *testing.T, c *enginetest.Call) int {
	t.Helper()
	for {
		m, err := c.Next(timeoutCtx(t, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Event == "started" {
			return intField(t, m, "pid")
		}
	}
}

func TestSIGQUITDrains(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--parallel", "2")
	wk := attach(t, eng)
	running := run(t, wk, "d1", step{"events": 1}, step{"sleep_ms": 1500}, step{"events": 1})
	if _, err := running.Next(timeoutCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	w.signal(syscall.SIGQUIT)
	// The late call must come after the drain began.
	eventually(t, 10*time.Second, "the worker to say it is draining", func() bool {
		return strings.Contains(w.logs.String(), "draining: running calls finish")
	})
	late := run(t, wk, "d2")
	answer, _ := wait(t, late)
	if answer.Error == nil || answer.Error.Type != "NodeCancelled" || answer.Error.Message != "the worker is draining" {
		t.Errorf("a call during the drain answered %s", answer.Raw)
	}
	answer, events := wait(t, running)
	if !answer.OK || len(events) != 1 {
		t.Errorf("the running call did not finish: %s", answer.Raw)
	}
	if code := w.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	saidLast(t, w, `msg=exiting reason="SIGQUIT: drained" exit_code=0`)
}

func TestTenDropsLeaveTheWorkerAsBefore(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--cancel-grace", "500ms")
	var fds []int
	for i := 0; i < 10; i++ {
		wk := attach(t, eng)
		c := run(t, wk, "drop", step{"announce": true}, step{"sleep_ms": 60000})
		runnerPID(t, c)
		fds = append(fds, openFDs(t, w.cmd.Process.Pid))
		wk.Drop()
	}
	wk := attach(t, eng)
	answer, _ := wait(t, run(t, wk, "final"))
	if !answer.OK {
		t.Fatal(string(answer.Raw))
	}
	if fds[9] > fds[0]+2 {
		t.Errorf("open file descriptors grew across drops: %v", fds)
	}
	// The final call's runner exits after its answer.
	eventually(t, 30*time.Second, "no runner processes left behind", func() bool { return len(childrenOf(w.cmd.Process.Pid)) == 0 })
}

// A peer that stops answering pings (a NAT that dropped the connection
// sends no FIN) is noticed by the keepalive, and the worker reattaches.
func TestDeadPeerIsNoticed(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the 40 s keepalive")
	}
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil)
	wk := attach(t, eng)
	wk.Freeze()
	start := time.Now()
	ctx := timeoutCtx(t, 90*time.Second)
	if _, err := eng.NextWorker(ctx); err != nil {
		t.Fatalf("no reattach after the peer went silent: %v", err)
	}
	took := time.Since(start)
	if took < 20*time.Second {
		t.Errorf("reattached after %s: the peer was dropped before it missed a pong", took)
	}
	// The promise is 40 s (a ping at 20 s, 20 s for its pong); the
	// margin covers the reconnection's backoff and a loaded machine.
	if took > 50*time.Second {
		t.Errorf("reattached after %s: a dead peer must be noticed within 40 s", took)
	}
	if !strings.Contains(w.logs.String(), "connection lost") {
		t.Errorf("the log does not say the connection was lost")
	}
}
