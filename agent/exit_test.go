package agent_test

// How `run` ends, as a batch scheduler and an operator see it: the exit
// code, and the last log record saying why.

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// runCommand runs `fluksio-worker run` in this process with a JSON log and
// the embedded runtime, and returns its exit code and its log records.
// One at a time: run sets up what is the process's (its signal handlers,
// its containment), as the worker it is meant to be.
func runCommand(t *testing.T, url string, extra ...string) (int, []map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	given, _ := findPython(ctx, t)
	args := append([]string{
		"--url", url,
		"--token", sessionToken,
		"--python", given,
		"--runtime", "embedded",
		"--warm", "0",
		"--state-dir", filepath.Join(t.TempDir(), "state"),
		"--log-format", "json",
		// No cgroup of its own for this test process: it is not a worker.
		"--containment", "subreaper",
	}, extra...)
	logs := &enginetest.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the worker's log:\n%s", logs.String())
		}
	})
	code := agent.RunCommand(ctx, args, logs, logs)
	return code, logRecords(t, logs.String())
}

func startTestEngine(t *testing.T) *enginetest.Engine {
	t.Helper()
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{sessionToken}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	return eng
}

// exited checks the exit code is code, and that the log's last record says
// the worker exits, why, and with which code.
func exited(t *testing.T, got int, records []map[string]any, code int, level, reason string) {
	t.Helper()
	if got != code {
		t.Fatalf("exit code %d; want %d", got, code)
	}
	last := records[len(records)-1]
	if last["msg"] != "exiting" || last["exit_code"] != float64(code) || last["reason"] != reason || last["level"] != level {
		t.Errorf("the last log record is %v; want msg exiting, exit_code %d, reason %q, level %s", last, code, reason, level)
	}
}

// A batch job pointed at the wrong place must not end as if it had done
// its work: --max-idle without ever attaching exits 4 with the last error.
func TestMaxIdleNeverAttachedFails(t *testing.T) {
	// A port nothing listens on: bound, then closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	code, records := runCommand(t, "ws://"+addr+"/api/v1/workers/attach", "--max-idle", "1s")
	exited(t, code, records, config.ExitNeverAttached, "ERROR", "never attached to the engine within --max-idle")
	var said map[string]any
	for _, r := range records {
		if r["last_error"] != nil {
			said = r
		}
	}
	if said == nil || said["level"] != "ERROR" || fmt.Sprint(said["last_error"]) == "" {
		t.Errorf("no ERROR record with the last error: %v", records)
	}
}

// Idle after a successful attach is the batch job's normal end: exit 0.
func TestMaxIdleAfterAttachExitsZero(t *testing.T) {
	eng := startTestEngine(t)
	code, records := runCommand(t, eng.AttachURL(), "--max-idle", "1s")
	exited(t, code, records, config.ExitOK, "INFO", "nothing ran for --max-idle")
}

// --max-calls says so on the way out.
func TestMaxCallsLastRecord(t *testing.T) {
	eng := startTestEngine(t)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
		defer cancel()
		wk, err := eng.NextWorker(ctx)
		if err != nil {
			return
		}
		c, err := wk.Run(nodeCall("one", "count", map[string]any{"n": 1}))
		if err == nil {
			c.WaitTimeout(callTimeout)
		}
	}()
	code, records := runCommand(t, eng.AttachURL(), "--max-calls", "1")
	exited(t, code, records, config.ExitOK, "INFO", "--max-calls answered")
}

// wss:// against an engine without TLS is a wrong URL, not an outage: it
// says what to write, and exits 2 at once instead of retrying forever.
func TestWSSAgainstPlainServer(t *testing.T) {
	eng := startTestEngine(t)
	code, records := runCommand(t, "wss://"+eng.Addr()+"/api/v1/workers/attach")
	exited(t, code, records, config.ExitUsage, "ERROR", "bad configuration")
	want := "the server at " + eng.Addr() + " does not speak TLS: use ws://" + eng.Addr() + "/api/v1/workers/attach"
	found := false
	for _, r := range records {
		found = found || strings.Contains(fmt.Sprint(r["error"]), want)
	}
	if !found {
		t.Errorf("no record says %q", want)
	}
}

// --python /bin/true exits 0 without running anything: it is refused at
// start (exit 2, saying what to do), not accepted for every call to fail,
// and the worker never attaches.
func TestPythonThatIsNotPythonIsRefused(t *testing.T) {
	eng := startTestEngine(t)
	code, records := runCommand(t, eng.AttachURL(), "--python", "/bin/true")
	exited(t, code, records, config.ExitUsage, "ERROR", "no Python to run node code on")
	said := fmt.Sprint(records)
	if !strings.Contains(said, "does not behave as Python") || !strings.Contains(said, "--python") {
		t.Errorf("the log does not say what is wrong and what to do: %v", records)
	}
	if n := len(eng.Hellos()); n != 0 {
		t.Errorf("the worker attached %d times with no Python", n)
	}
}

// Under systemd, the worker's last status line says it stopped, why and
// with which code, on a real notify socket: a unit that failed (here, a
// refused token) no longer shows the "not attached …, retrying" it showed
// while it ran.
func TestFinalStatusLineForSystemd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "")
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{"another-workers-token"}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	code, records := runCommand(t, eng.AttachURL())
	exited(t, code, records, config.ExitRefused, "ERROR", "refused by the engine")

	// Every notification sent is queued on the socket; read them all.
	var statuses []string
	buf := make([]byte, 4096)
	for {
		conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			break
		}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			if s, ok := strings.CutPrefix(line, "STATUS="); ok {
				statuses = append(statuses, s)
			}
		}
	}
	want := "stopped: refused by the engine (exit code 1)"
	if len(statuses) == 0 || statuses[len(statuses)-1] != want {
		t.Errorf("the status lines systemd got: %q; want the last to be %q", statuses, want)
	}
}

// A per-call limit that cannot be had (here: no cgroup per call) stops the
// worker at start, exit 2, saying what to do; it never runs calls without it.
func TestCallLimitWithoutCgroupsIsRefusedAtStart(t *testing.T) {
	eng := startTestEngine(t)
	code, records := runCommand(t, eng.AttachURL(), "--call-pids-max", "64")
	exited(t, code, records, config.ExitUsage, "ERROR", "a per-call limit cannot be had here")
	var said bool
	for _, r := range records {
		if e, _ := r["error"].(string); strings.Contains(e, "--call-memory-max, --call-pids-max and --call-cpu-max") && strings.Contains(e, "Delegate=yes") {
			said = true
		}
	}
	if !said {
		t.Errorf("the log does not say why the limits cannot be had and what to do: %v", records)
	}
}

// After the worker is gone, its status file says why it ended and with
// which exit code, as its last log record and systemd's last STATUS= do,
// for `status` to show.
func TestStatusFileSaysWhyTheWorkerStopped(t *testing.T) {
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{"another-workers-token"}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	stateDir := filepath.Join(t.TempDir(), "state")
	code, records := runCommand(t, eng.AttachURL(), "--state-dir", stateDir)
	exited(t, code, records, config.ExitRefused, "ERROR", "refused by the engine")
	st, err := status.Read(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Exit == nil || st.Exit.Code != config.ExitRefused || st.Exit.Reason != "refused by the engine" || st.Exit.At.IsZero() {
		t.Errorf("the status file says the worker ended with %+v; want exit code 1, refused by the engine", st.Exit)
	}
}
