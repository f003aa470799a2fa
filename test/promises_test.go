package test

// The README's promises about the connection, each checked from where a
// user or an engine would notice it: the fake engine's side of the socket
// (what it received and when), the worker's exit code, its log, the
// processes left on the machine.

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// startDoorman starts a listener that records attach attempts and lets
// none in: status 0 hangs up, else it answers that HTTP status.
func startDoorman(t *testing.T, status int) *enginetest.Doorman {
	t.Helper()
	d, err := enginetest.StartDoorman(status)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// workerAt is startWorker for a --url that is not an Engine.
func workerAt(t *testing.T, url string, args ...string) *worker {
	t.Helper()
	base := []string{
		"run",
		"--url", url,
		"--python", fakeRunnerPath(t),
		"--runtime", "embedded",
		"--state-dir", t.TempDir(),
		"--log-level", "debug",
		"--log-format", "json",
	}
	return startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, append(base, args...)...)
}

// logRecords parses the worker's JSON log; lines that are not JSON
// (there should be none) are skipped.
func logRecords(w *worker) []map[string]any {
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(w.logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			recs = append(recs, rec)
		}
	}
	return recs
}

// retryWaits returns the waits the worker logged before each reconnection
// (the "retry_in" attribute of its "connection lost" and "cannot reach the engine" records).
func retryWaits(t *testing.T, w *worker) []time.Duration {
	t.Helper()
	var waits []time.Duration
	for _, rec := range logRecords(w) {
		s, ok := rec["retry_in"].(string)
		if !ok {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("retry_in %q: %v", s, err)
		}
		waits = append(waits, d)
	}
	return waits
}

func gaps(attempts []enginetest.Attempt) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(attempts); i++ {
		out = append(out, attempts[i].At.Sub(attempts[i-1].At))
	}
	return out
}

// backoffAt is the nominal wait before reconnection i+1 (i from 0): 1 s
// doubling to 30 s. With jitter the wait is between half of it and all.
func backoffAt(i int) time.Duration {
	return min(time.Second<<i, 30*time.Second)
}

// A lost connection is retried after 1 s, doubling to 30 s, with jitter:
// measured as the engine sees it, between attach attempts that never get
// in. The bounds are the promise's (each wait between half the nominal
// backoff and all of it) plus generous slack above for a loaded machine;
// nothing here is a benchmark.
func TestBackoffDoublesWithJitter(t *testing.T) {
	t.Parallel()
	d := startDoorman(t, 0)
	w := workerAt(t, d.AttachURL())
	const n = 5 // 4 waits: about 1+2+4+8 s at most
	attempts, err := d.WaitAttempts(timeoutCtx(t, 60*time.Second), n)
	if err != nil {
		t.Fatal(err)
	}
	measured := gaps(attempts[:n])
	t.Logf("gaps between attach attempts: %v", measured)
	for i, g := range measured {
		b := backoffAt(i)
		if g < b/2-50*time.Millisecond || g > b+3*time.Second {
			t.Errorf("wait %d was %s; want between %s and %s (backoff %s, jittered)", i+1, g, b/2, b, b)
		}
	}
	if measured[3] < 2*measured[0] {
		t.Errorf("the backoff does not grow: %v", measured)
	}

	// Jitter: the waits the worker chose are not the bare doubling, nor
	// one fixed fraction of it. The engine's side can only tell a wait
	// plus the time to dial again, so the chosen waits come from the log,
	// checked against the gaps the engine saw.
	eventually(t, 10*time.Second, "the log to give each wait", func() bool { return len(retryWaits(t, w)) >= n-1 })
	logged := retryWaits(t, w)[:n-1]
	t.Logf("waits the worker logged: %v", logged)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, wt := range logged {
		b := backoffAt(i)
		if wt < b/2 || wt > b {
			t.Errorf("logged wait %d is %s; want between %s and %s", i+1, wt, b/2, b)
		}
		if measured[i] < wt-50*time.Millisecond {
			t.Errorf("wait %d: logged %s but the engine saw the next attempt after %s", i+1, wt, measured[i])
		}
		r := float64(wt) / float64(b)
		lo, hi = min(lo, r), max(hi, r)
	}
	if hi-lo < 0.01 {
		t.Errorf("the waits %v are each the same fraction of the backoff: no jitter", logged)
	}
}

// The doubling stops at 30 s: the seventh wait would be 64 s uncapped.
func TestBackoffStopsAt30s(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out seven reconnections (up to 91 s)")
	}
	t.Parallel()
	d := startDoorman(t, 0)
	workerAt(t, d.AttachURL())
	const n = 8
	attempts, err := d.WaitAttempts(timeoutCtx(t, 150*time.Second), n)
	if err != nil {
		t.Fatal(err)
	}
	measured := gaps(attempts[:n])
	t.Logf("gaps between attach attempts: %v", measured)
	for i := 5; i < len(measured); i++ {
		// Uncapped, the last wait is at least 32 s.
		if g := measured[i]; g < 15*time.Second-50*time.Millisecond || g > 31500*time.Millisecond {
			t.Errorf("wait %d was %s; want 15 s to 30 s (the backoff stays at 30 s)", i+1, g)
		}
	}
}

// --max-idle counts while the worker cannot reach the engine too: a batch
// job whose engine is gone gives its node back, and since it never
// attached it exits ExitNeverAttached, so the job does not end COMPLETED.
func TestMaxIdleWhileDisconnected(t *testing.T) {
	t.Parallel()
	d := startDoorman(t, 0)
	start := time.Now()
	w := workerAt(t, d.AttachURL(), "--max-idle", "3")
	if code := w.wait(30 * time.Second); code != config.ExitNeverAttached {
		t.Fatalf("exit %d, want %d (never attached)", code, config.ExitNeverAttached)
	}
	if took := time.Since(start); took < 2500*time.Millisecond {
		t.Errorf("exited after %s, before --max-idle 3", took)
	}
	if n := len(d.Attempts()); n < 2 {
		t.Errorf("%d attach attempts: the worker was not retrying while idle", n)
	}
}

// A stop or a drain while the worker waits to reconnect ends the wait:
// the worker exits 0 at once, not after the backoff.
func TestStopAndDrainWhileDisconnected(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			d := startDoorman(t, 0)
			w := workerAt(t, d.AttachURL())
			// After the fourth failed attempt the worker waits 4 s to 8 s.
			if _, err := d.WaitAttempts(timeoutCtx(t, 60*time.Second), 4); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "the worker to say it waits", func() bool { return len(retryWaits(t, w)) >= 4 })
			sent := time.Now()
			w.signal(sig)
			if code := w.wait(30 * time.Second); code != 0 {
				t.Fatalf("exit %d, want 0", code)
			}
			if took := time.Since(sent); took > 2500*time.Millisecond {
				t.Errorf("exited %s after %s: the signal waited for the backoff", took, sig)
			}
			if n := len(d.Attempts()); n != 4 {
				t.Errorf("%d attach attempts after %s, want 4", n, sig)
			}
		})
	}
}

// HTTP 403 on the handshake is a refusal: exit 1, no second attempt.
func TestForbiddenExitsOneWithoutRetry(t *testing.T) {
	t.Parallel()
	d := startDoorman(t, 403)
	w := workerAt(t, d.AttachURL())
	if code := w.wait(30 * time.Second); code != 1 {
		t.Fatalf("HTTP 403: exit %d, want 1", code)
	}
	if n := len(d.Attempts()); n != 1 {
		t.Errorf("%d attach attempts; a 403 must not be retried", n)
	}
	if !strings.Contains(w.logs.String(), "403") {
		t.Errorf("the log does not name the 403:\n%s", w.logs.String())
	}
}

// Every way the worker ends an attached session on purpose closes the
// WebSocket cleanly: a close frame with the normal close code.
func TestCleanCloseFrame(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		sig  syscall.Signal // 0: wait for --max-idle
	}{
		{"SIGTERM", nil, syscall.SIGTERM},
		{"SIGQUIT", nil, syscall.SIGQUIT},
		{"max-idle", []string{"--max-idle", "1"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eng := startEngine(t, enginetest.Options{})
			w := startWorker(t, eng, nil, tc.args...)
			wk := attach(t, eng)
			if tc.sig != 0 {
				w.signal(tc.sig)
			}
			if code := w.wait(30 * time.Second); code != 0 {
				t.Fatalf("exit %d, want 0", code)
			}
			select {
			case <-wk.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the engine's side of the connection is still open")
			}
			if code, text := wk.CloseFrame(); code != enginetest.CloseNormal {
				t.Errorf("close frame code %d (%q), want %d (0: no close frame)", code, text, enginetest.CloseNormal)
			}
		})
	}
}

// A node that prints a flood on stderr gets at most 1000 lines a second
// into the worker's log, and the rest is counted, not lost silently.
func TestRunnerStderrLogBudget(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--log-format", "json")
	wk := attach(t, eng)
	const lines = 20000
	answer, _ := wait(t, run(t, wk, "flood", step{"stderr_lines": lines}))
	if !answer.OK {
		t.Fatalf("answer %s", answer.Raw)
	}
	var logged, dropped int
	var first, last time.Time
	count := func() {
		logged, dropped = 0, 0
		for _, rec := range logRecords(w) {
			if line, _ := rec["line"].(string); rec["msg"] == "node output" && strings.HasPrefix(line, "node log line ") {
				logged++
				at, _ := time.Parse(time.RFC3339Nano, rec["time"].(string))
				if first.IsZero() {
					first = at
				}
				last = at
			}
			if n, ok := rec["dropped"].(float64); ok {
				dropped += int(n)
			}
		}
	}
	eventually(t, 20*time.Second, "the worker to account for every line", func() bool {
		count()
		return logged+dropped >= lines
	})
	windows := int(last.Sub(first)/time.Second) + 1
	t.Logf("%d lines logged over %s, %d counted as dropped", logged, last.Sub(first), dropped)
	if logged > 1000*windows || dropped == 0 {
		t.Errorf("%d of %d lines logged in %d s, %d dropped: want at most 1000 a second and a dropped count", logged, lines, windows, dropped)
	}
	if logged+dropped != lines {
		t.Errorf("%d logged + %d dropped != %d written", logged, dropped, lines)
	}
}

// After a node answers, whatever it started in its process group is
// stopped within the grace period: a grandchild does not outlive the call.
func TestAnsweredCallLeavesNoGrandchild(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	startWorker(t, eng, nil, "--cancel-grace", "1s")
	wk := attach(t, eng)
	answer, events := wait(t, run(t, wk, "gc", step{"grandchild": true}))
	if !answer.OK {
		t.Fatalf("answer %s", answer.Raw)
	}
	var grandchild int
	for _, ev := range events {
		if ev.Event == "grandchild" {
			grandchild = intField(t, ev, "pid")
		}
	}
	if grandchild == 0 {
		t.Fatalf("no grandchild event in %q", rawOf(events))
	}
	t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })
	eventually(t, 15*time.Second, "the answered call's grandchild to be stopped", func() bool { return !platform.ProcessAlive(grandchild) })
}

// The worker pings every 20 s, and a quiet engine that answers them keeps
// the connection past the 40 s within which a dead one is noticed.
func TestPingsEvery20s(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for two pings (40 s)")
	}
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	startWorker(t, eng, nil)
	wk := attach(t, eng)
	attached := time.Now()
	pings, err := wk.WaitPings(timeoutCtx(t, 70*time.Second), 2)
	if err != nil {
		t.Fatalf("after %s: %v", time.Since(attached).Round(time.Second), err)
	}
	first, second := pings[0].Sub(attached), pings[1].Sub(pings[0])
	t.Logf("pings %s after the attach, then %s later", first, second)
	for _, g := range []time.Duration{first, second} {
		if g < 15*time.Second || g > 27*time.Second {
			t.Errorf("pings %s and %s apart; want every 20 s", first, second)
			break
		}
	}
	select {
	case <-wk.Done():
		t.Errorf("a healthy, quiet connection was dropped after %s", time.Since(attached))
	case <-time.After(time.Until(attached.Add(45 * time.Second))):
	}
}

// Without --state-dir the runtime cache and the status file go to
// $STATE_DIRECTORY (systemd's), else ~/.cache/fluksio-worker.
func TestDefaultStateDirectory(t *testing.T) {
	t.Parallel()
	for _, systemd := range []bool{false, true} {
		name := map[bool]string{false: "home", true: "STATE_DIRECTORY"}[systemd]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eng := startEngine(t, enginetest.Options{})
			home, stateDir := t.TempDir(), t.TempDir()
			env := []string{"FLUKSIO_WORKER_TOKEN=" + testToken, "HOME=" + home, "XDG_CACHE_HOME="}
			want := filepath.Join(home, ".cache", "fluksio-worker")
			if systemd {
				env = append(env, "STATE_DIRECTORY="+stateDir)
				want = stateDir
			}
			startBinary(t, env, "run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded")
			attach(t, eng)
			if runtimes, _ := filepath.Glob(filepath.Join(want, "runtime", "*.py")); len(runtimes) != 1 {
				t.Errorf("the runtime is not cached in %s: %v", want, runtimes)
			}
			if systemd {
				if _, err := os.Stat(filepath.Join(home, ".cache", "fluksio-worker")); err == nil {
					t.Errorf("with $STATE_DIRECTORY set the worker still wrote to ~/.cache")
				}
			}
		})
	}
}

// `check` exits 1 when an item fails, 0 when all pass.
func TestCheckExitsOneWhenACheckFails(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	args := []string{"check", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded"}
	w := startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, args...)
	if code := w.wait(60 * time.Second); code != 0 {
		t.Fatalf("check with a good token: exit %d, want 0\n%s", code, w.logs.String())
	}
	w = startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=not-the-token"}, args...)
	if code := w.wait(60 * time.Second); code != 1 {
		t.Errorf("check with a refused token: exit %d, want 1\n%s", code, w.logs.String())
	}
	if out := w.logs.String(); !strings.Contains(out, "FAIL") || !strings.Contains(out, "token") {
		t.Errorf("check does not say which item failed:\n%s", out)
	}
}
