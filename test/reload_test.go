package test

// A reload (SIGHUP) of a foreground worker: running calls finish and are
// answered on the connection they came on, new ones are declined, then the
// binary on disk runs again in the same process and attaches anew.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// reloadable is a worker run from its own copy of the binary, which the
// test can replace as a package upgrade does.
type reloadable struct {
	*worker
	bin      string // the binary's path
	stateDir string
}

func startReloadable(t *testing.T, eng *enginetest.Engine, args ...string) *reloadable {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fluksio-worker")
	copyFile(t, workerBinary(t), bin)
	stateDir := t.TempDir()
	base := []string{"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
		"--state-dir", stateDir, "--log-level", "debug"}
	w := startProgram(t, bin, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, append(base, args...)...)
	return &reloadable{worker: w, bin: bin, stateDir: stateDir}
}

func (r *reloadable) pid() int { return r.cmd.Process.Pid }

// upgrade puts a new binary in place as dpkg does: written beside, then
// renamed over, so the running process's file is deleted.
func (r *reloadable) upgrade(t *testing.T) {
	t.Helper()
	copyFile(t, workerBinary(t), r.bin+".dpkg-new")
	if err := os.Rename(r.bin+".dpkg-new", r.bin); err != nil {
		t.Fatal(err)
	}
}

func (r *reloadable) status(t *testing.T) status.Status {
	t.Helper()
	st, err := status.Read(r.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

func procFile(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fdTargets lists what a process's descriptors point at, with the numbers
// of sockets, pipes and anonymous inodes left out (those differ run to run).
func fdTargets(t *testing.T, pid int) []string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if kind, _, ok := strings.Cut(target, ":["); ok {
			target = kind
		}
		out = append(out, target)
	}
	slices.Sort(out)
	return out
}

// answerError decodes an answer's ok and error.
func answerError(t *testing.T, m enginetest.Message) (ok bool, typ, message string) {
	t.Helper()
	var a struct {
		OK    bool `json:"ok"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Raw, &a); err != nil {
		t.Fatalf("answer %s: %v", m.Raw, err)
	}
	return a.OK, a.Error.Type, a.Error.Message
}

func gone(t *testing.T, wk *enginetest.Worker, within time.Duration, what string) {
	t.Helper()
	select {
	case <-wk.Done():
	case <-time.After(within):
		t.Fatalf("the connection is still open %s after %s", within, what)
	}
}

// TestReloadLetsCallsFinish is an upgrade of a foreground worker with a
// call running: the binary is replaced on disk, SIGHUP. The call keeps
// streaming and is answered ok on its connection; a call sent meanwhile is
// declined as a drain declines it; status says for which call the reload
// waits; then the same process runs the new binary (not the deleted one),
// with the same argv, environment and descriptors, and takes calls again.
// A second SIGHUP while waiting changes nothing.
func TestReloadLetsCallsFinish(t *testing.T) {
	eng := startEngine(t, enginetest.Options{})
	r := startReloadable(t, eng)
	wk := attach(t, eng)
	pid := r.pid()
	time.Sleep(300 * time.Millisecond) // settled: the hello's helpers are gone
	fdsBefore := fdTargets(t, pid)
	t.Logf("descriptors before the reload: %v", fdsBefore)
	argv, environ := procFile(t, pid, "cmdline"), procFile(t, pid, "environ")

	c1 := run(t, wk, "c1", step{"events": 1}, step{"sleep_ms": 1500}, step{"events": 1}, step{"sleep_ms": 1500}, step{"events": 1})
	ctx := timeoutCtx(t, 30*time.Second)
	if _, err := c1.Next(ctx); err != nil {
		t.Fatal(err)
	}
	r.upgrade(t)
	if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); !strings.HasSuffix(exe, "(deleted)") {
		t.Fatalf("after the upgrade the old process runs %q; the test needs it to run a deleted file", exe)
	}
	r.signal(syscall.SIGHUP)
	r.signal(syscall.SIGHUP) // a second reload while one waits
	eventually(t, 5*time.Second, "status to show the reload waiting for c1", func() bool {
		st, err := status.Read(r.stateDir)
		return err == nil && st.State == "reloading" && st.Reload != nil && slices.Equal(st.Reload.Waiting, []string{"c1"})
	})

	// A new call is declined, at once, as a drain declines it.
	answer, _ := wait(t, run(t, wk, "c2", step{"sleep_ms": 10}))
	if ok, typ, msg := answerError(t, answer); ok || typ != "NodeCancelled" || msg != "the worker is reloading" {
		t.Errorf("a call sent during the reload: %s; want NodeCancelled, the worker is reloading", answer.Raw)
	}

	answer, events := wait(t, c1)
	if ok, _, _ := answerError(t, answer); !ok {
		t.Errorf("the running call was not let finish: %s", answer.Raw)
	}
	if n := len(events); n < 2 {
		t.Errorf("the running call streamed %d more events after the first; want 2", n)
	}
	gone(t, wk, 10*time.Second, "the call's answer")

	wk = attach(t, eng)
	if r.pid() != pid || !platform.ProcessAlive(pid) {
		t.Fatalf("the worker is not the same process after the reload")
	}
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err != nil || exe != r.bin {
		t.Errorf("after the reload the process runs %q (%v); want the new %s", exe, err, r.bin)
	}
	if got := procFile(t, pid, "cmdline"); got != argv {
		t.Errorf("argv changed across the reload:\n%q\n%q", argv, got)
	}
	if got := procFile(t, pid, "environ"); got != environ {
		t.Errorf("the environment changed across the reload:\n%q\n%q", environ, got)
	}
	time.Sleep(300 * time.Millisecond)
	if got := fdTargets(t, pid); !slices.Equal(got, fdsBefore) {
		t.Errorf("descriptors leaked across the exec: before %v, after %v", fdsBefore, got)
	}
	if answer, _ := wait(t, run(t, wk, "c3", step{"events": 1})); !strings.Contains(string(answer.Raw), `"ok":true`) {
		t.Errorf("after the reload: %s", answer.Raw)
	}
	if st := r.status(t); st.Reload != nil || st.PID != pid {
		t.Errorf("status after the reload: %+v", st)
	}
	// status counts on across the reload: c1 before it, c3 after.
	eventually(t, 5*time.Second, "status to count c1 and c3 done", func() bool {
		st, err := status.Read(r.stateDir)
		return err == nil && st.CallsDone == 2
	})
	// Only one reload happened: the connection stays.
	select {
	case <-wk.Done():
		t.Error("a second reload followed the first")
	case <-time.After(time.Second):
	}

	// With nothing running, a reload is immediate: it waits for no call
	// (said by the log, not timed: a loaded machine takes seconds to exec).
	before := len(r.logs.String())
	r.signal(syscall.SIGHUP)
	gone(t, wk, 30*time.Second, "a reload with nothing running")
	attach(t, eng)
	if log := r.logs.String()[before:]; !strings.Contains(log, "reloading: nothing is running") || strings.Contains(log, "reloading once the running calls finish") {
		t.Errorf("a reload with nothing running waited for calls:\n%s", log)
	}
	if r.pid() != pid || !platform.ProcessAlive(pid) {
		t.Fatal("not the same process after an idle reload")
	}
	r.signal(syscall.SIGTERM)
	if code := r.wait(10 * time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
}

// TestReloadTimeout: a call longer than --reload-timeout is stopped when it
// runs out, answered NodeCancelled, and the worker comes back.
func TestReloadTimeout(t *testing.T) {
	eng := startEngine(t, enginetest.Options{})
	r := startReloadable(t, eng, "--reload-timeout", "1s", "--cancel-grace", "1s")
	wk := attach(t, eng)
	pid := r.pid()
	c1 := run(t, wk, "c1", step{"announce": true}, step{"sleep_ms": 60000})
	m, err := c1.Next(timeoutCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runner := intField(t, m, "pid")
	start := time.Now()
	r.signal(syscall.SIGHUP)
	answer, _ := wait(t, c1)
	took := time.Since(start)
	if ok, typ, msg := answerError(t, answer); ok || typ != "NodeCancelled" || !strings.Contains(msg, "--reload-timeout") {
		t.Errorf("the call over --reload-timeout answered %s; want NodeCancelled naming --reload-timeout", answer.Raw)
	}
	// Not before the bound; and not the node's own 60 s.
	if took < time.Second || took > 30*time.Second {
		t.Errorf("the call was stopped after %v; --reload-timeout is 1s", took)
	}
	gone(t, wk, 10*time.Second, "the stopped call")
	wk = attach(t, eng)
	if r.pid() != pid || platform.ProcessAlive(runner) {
		t.Errorf("after the reload: pid %d (was %d), runner alive %v", r.pid(), pid, platform.ProcessAlive(runner))
	}
	if answer, _ := wait(t, run(t, wk, "c2", step{"events": 1})); !strings.Contains(string(answer.Raw), `"ok":true`) {
		t.Errorf("after the reload: %s", answer.Raw)
	}
}

// TestStopDuringReload: SIGTERM while a reload waits is a stop: the call is
// stopped and reported, and the worker exits 0 instead of coming back.
func TestStopDuringReload(t *testing.T) {
	eng := startEngine(t, enginetest.Options{})
	r := startReloadable(t, eng)
	wk := attach(t, eng)
	c1 := run(t, wk, "c1", step{"announce": true}, step{"sleep_ms": 60000})
	if _, err := c1.Next(timeoutCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	r.signal(syscall.SIGHUP)
	eventually(t, 5*time.Second, "the reload to wait", func() bool {
		return strings.Contains(r.logs.String(), "reloading once the running calls finish")
	})
	r.signal(syscall.SIGTERM)
	answer, _ := wait(t, c1)
	if ok, typ, msg := answerError(t, answer); ok || typ != "NodeCancelled" || msg != "the worker is stopping" {
		t.Errorf("a stop during a reload answered %s", answer.Raw)
	}
	if code := r.wait(15 * time.Second); code != 0 {
		t.Errorf("exit %d; want 0", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := eng.NextWorker(ctx); err == nil {
		t.Error("the worker attached again after a stop during a reload")
	}
}

// TestReloadWhileDisconnected: nothing can run without a connection, so a
// reload then re-executes at once, and the new process attaches when the
// engine is back.
func TestReloadWhileDisconnected(t *testing.T) {
	eng := startEngine(t, enginetest.Options{})
	r := startReloadable(t, eng)
	attach(t, eng)
	pid := r.pid()
	restarted := make(chan error, 1)
	go func() { restarted <- eng.Restart(4 * time.Second) }()
	eventually(t, 10*time.Second, "the worker to notice", func() bool {
		return strings.Contains(r.logs.String(), "connection lost; reconnecting")
	})
	r.signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, "the re-exec", func() bool {
		return strings.Contains(r.logs.String(), "executing the binary on disk")
	})
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	attach(t, eng)
	if r.pid() != pid || !platform.ProcessAlive(pid) {
		t.Error("not the same process")
	}
}

// stillAttached fails t if a refused reload closed wk or ended r.
func stillAttached(t *testing.T, r *reloadable, wk *enginetest.Worker) {
	t.Helper()
	select {
	case <-wk.Done():
		t.Fatal("a refused reload closed the connection")
	case <-r.exited:
		t.Fatalf("a refused reload ended the worker")
	default:
	}
}

// TestReloadRefusedWhenTheNewBinaryWouldNotStart: a reload checks first
// that the binary on disk accepts the configuration it will read. With the
// token file rotated away, or a token that came from a pipe, the worker
// refuses the reload, says so in its log and status, and keeps serving on
// the same connection; once the cause is mended, a reload goes through.
func TestReloadRefusedWhenTheNewBinaryWouldNotStart(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "fluksio-worker")
	copyFile(t, workerBinary(t), bin)
	stateDir := t.TempDir()
	common := []string{"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded", "--log-level", "debug"}
	w := startProgram(t, bin, nil, append(common, "--state-dir", stateDir, "--token-file", tokenFile)...)
	r := &reloadable{worker: w, bin: bin, stateDir: stateDir}
	wk := attach(t, eng)

	os.Remove(tokenFile)
	r.signal(syscall.SIGHUP)
	eventually(t, 30*time.Second, "status to show the refused reload", func() bool {
		st, err := status.Read(stateDir)
		return err == nil && st.ReloadRefused != nil && strings.Contains(st.ReloadRefused.Reason, "token file")
	})
	if !strings.Contains(r.logs.String(), "reload refused") {
		t.Errorf("the log does not say the reload was refused")
	}
	if answer, _ := wait(t, run(t, wk, "still")); !answer.OK {
		t.Errorf("after a refused reload the worker answered %s", answer.Raw)
	}
	stillAttached(t, r, wk)

	// Mended: the reload happens.
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.signal(syscall.SIGHUP)
	gone(t, wk, 30*time.Second, "a reload with the token file back")
	if answer, _ := wait(t, run(t, attach(t, eng), "after")); !answer.OK {
		t.Errorf("after the reload: %s", answer.Raw)
	}

	// A token read from standard input cannot be read again.
	cmd := exec.Command(bin, append(common, "--state-dir", t.TempDir(), "--token", "-")...)
	cmd.Env = cleanEnv()
	cmd.Stdin = strings.NewReader(testToken + "\n")
	piped := startCommand(t, cmd)
	wk = attach(t, eng)
	piped.signal(syscall.SIGHUP)
	eventually(t, 30*time.Second, "the reload to be refused", func() bool {
		return strings.Contains(piped.logs.String(), "reload refused")
	})
	if answer, _ := wait(t, run(t, wk, "piped")); !answer.OK {
		t.Errorf("after a refused reload the worker answered %s", answer.Raw)
	}
}

// TestReloadToATakenListenAddressIsRefused: a reload whose config moves
// --listen to a port another program holds is refused before anything
// stops; the worker keeps serving calls and its old address, and its log
// and status say what to do. Once the port is free the reload goes
// through and the new process serves there; a reload that keeps that
// address (held by the worker itself) goes through too.
func TestReloadToATakenListenAddressIsRefused(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	config := filepath.Join(t.TempDir(), "config.toml")
	setListen := func(addr string) {
		t.Helper()
		if err := os.WriteFile(config, []byte("listen = \""+addr+"\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	setListen("127.0.0.1:0")
	r := startReloadable(t, eng, "--config", config)
	stopAtCleanup(r.worker)
	wk := attach(t, eng)
	old := monitorAddr(t, r.worker)

	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	setListen(taken.Addr().String())
	r.signal(syscall.SIGHUP)
	eventually(t, 30*time.Second, "status to show the refused reload", func() bool {
		st, err := status.Read(r.stateDir)
		return err == nil && st.ReloadRefused != nil && strings.Contains(st.ReloadRefused.Reason, "address already in use")
	})
	logs := r.logs.String()
	if !strings.Contains(logs, "reload refused") || !strings.Contains(logs, "choose another --listen") {
		t.Errorf("the log does not say the reload was refused and what to do:\n%s", logs)
	}
	if answer, _ := wait(t, run(t, wk, "still")); !answer.OK {
		t.Errorf("after a refused reload the worker answered %s", answer.Raw)
	}
	if code, _ := get(t, "GET", "http://"+old+"/livez"); code != http.StatusOK {
		t.Errorf("/livez on the old address after a refused reload: HTTP %d", code)
	}
	stillAttached(t, r, wk)

	// Freed: the reload happens, and the new process serves there.
	addr := taken.Addr().String()
	taken.Close()
	r.signal(syscall.SIGHUP)
	gone(t, wk, 30*time.Second, "a reload with the port free")
	wk = attach(t, eng)
	if code, _ := get(t, "GET", "http://"+addr+"/livez"); code != http.StatusOK {
		t.Errorf("/livez on the new address after the reload: HTTP %d", code)
	}

	// Again with the same address, which the worker holds itself.
	r.signal(syscall.SIGHUP)
	gone(t, wk, 30*time.Second, "a reload keeping its own address")
	if answer, _ := wait(t, run(t, attach(t, eng), "after")); !answer.OK {
		t.Errorf("after the second reload: %s", answer.Raw)
	}
	if code, _ := get(t, "GET", "http://"+addr+"/livez"); code != http.StatusOK {
		t.Errorf("/livez after the second reload: HTTP %d", code)
	}
}
