package test

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// procStatus reads numbers (kB, or a count) from /proc/PID/status.
func procStatus(t testing.TB, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			n, _ := strconv.Atoi(strings.Fields(line)[1])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func memLine(t testing.TB, pid int) string {
	return fmt.Sprintf("threads %d, VmRSS %.1f MiB, VmHWM %.1f MiB", procStatus(t, pid, "Threads"),
		float64(procStatus(t, pid, "VmRSS"))/1024, float64(procStatus(t, pid, "VmHWM"))/1024)
}

// 10,000 calls sent at once at --parallel 1: one runner process, 10,000
// calls waiting (the bound), each heard from every 10 s, and the calls
// beyond the bound answered at once with an error that names it. Then a
// stop answers every waiting call without starting one. The worker's
// threads and memory are logged (never asserted as timings); run with -v
// to see them.
func TestTenThousandCallsAtParallelOne(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 10,010 calls and waits out a heartbeat")
	}
	eng := startEngine(t, enginetest.Options{})
	state := t.TempDir()
	w := startProgram(t, releaseWorkerBin(t), []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
		"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
		"--state-dir", state, "--parallel", "1", "--cancel-grace", "1s")
	wk := attach(t, eng)
	pid := w.cmd.Process.Pid
	tally := wk.StartTally()
	time.Sleep(500 * time.Millisecond)
	t.Logf("attached, idle: %s", memLine(t, pid))

	const waiting, beyond = 10000, 9
	total := 1 + waiting + beyond
	sent := time.Now()
	for i := 0; i < total; i++ {
		steps := []step{{"announce": true}}
		if i == 0 {
			steps = append(steps, step{"sleep_ms": 60000})
		}
		b, _ := json.Marshal(map[string]any{"op": "run", "call_id": fmt.Sprintf("t%05d", i), "steps": steps})
		if err := wk.Send(b); err != nil {
			t.Fatal(err)
		}
	}
	// The calls beyond the bound come last, so their answers mean every
	// call before them was taken.
	if err := tally.WaitAnswers(timeoutCtx(t, 60*time.Second), beyond); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls sent, %d waiting, %d answered at once after %s: %s", total, waiting, beyond,
		time.Since(sent).Round(time.Millisecond), memLine(t, pid))
	for i := 1 + waiting; i < total; i++ {
		m, ok := tally.Answer(fmt.Sprintf("t%05d", i))
		if !ok || m.Error == nil || !strings.Contains(m.Error.Message, "at most 10000 calls") || !strings.Contains(m.Error.Message, "--parallel 1") {
			t.Fatalf("call %d beyond the bound answered %s", i, m.Raw)
		}
	}
	if kids := childrenOf(pid); len(kids) != 1 {
		t.Errorf("%d runner processes, want 1 (--parallel 1)", len(kids))
	}
	eventually(t, 10*time.Second, "the status file to count the waiting calls", func() bool {
		st, err := status.Read(state)
		return err == nil && st.CallsQueued == waiting && st.CallsRunning == 1
	})

	// Every waiting call hears a heartbeat within 10 s of arriving.
	eventually(t, 30*time.Second, "a heartbeat for every waiting call", func() bool {
		return tally.EventsOfKind("heartbeat") >= waiting
	})
	t.Logf("after a round of %d heartbeats (%s after sending): %s", waiting, time.Since(sent).Round(time.Millisecond), memLine(t, pid))

	w.signal(syscall.SIGTERM)
	if err := tally.WaitAnswers(timeoutCtx(t, 60*time.Second), total); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	stopped := 0
	for id, m := range tally.Answers() {
		if m.Error != nil && m.Error.Type == "NodeCancelled" && m.Error.Message == "the worker is stopping" {
			stopped++
		} else if id <= fmt.Sprintf("t%05d", waiting) {
			t.Errorf("%s answered %s", id, m.Raw)
		}
	}
	if stopped != 1+waiting {
		t.Errorf("%d calls answered \"the worker is stopping\", want %d", stopped, 1+waiting)
	}
	if n := tally.EventsOfKind("started"); n != 1 {
		t.Errorf("%d runners started, want only the first call's", n)
	}
	if n := tally.Late(); n != 0 {
		t.Errorf("%d frames followed their call's answer", n)
	}
}
