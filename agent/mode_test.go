package agent

import (
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// The worker's mode is the strongest one asked, whatever the order the
// requests come in: a reload never overrules a drain, stop or kill, and
// nothing goes back to serving.
func TestModePrecedence(t *testing.T) {
	t.Parallel()
	cases := []struct {
		asked []mode
		want  mode
	}{
		{nil, modeServing},
		{[]mode{modeReloading}, modeReloading},
		{[]mode{modeReloading, modeReloading}, modeReloading},
		{[]mode{modeReloading, modeDraining}, modeDraining},
		{[]mode{modeDraining, modeReloading}, modeDraining},
		{[]mode{modeStopping, modeReloading}, modeStopping},
		{[]mode{modeReloading, modeStopping}, modeStopping},
		{[]mode{modeStopping, modeDraining}, modeStopping},
		{[]mode{modeDraining, modeStopping}, modeStopping},
		{[]mode{modeStopping, modeKilling}, modeKilling},
		{[]mode{modeKilling, modeStopping, modeDraining, modeReloading}, modeKilling},
	}
	for _, c := range cases {
		l := newLifecycle(nil)
		for _, m := range c.asked {
			l.ask(m)
		}
		if got := l.mode(); got != c.want {
			t.Errorf("asked %v: mode %v, want %v", c.asked, got, c.want)
		}
	}
}

// ask says what the worker was doing and whether the request changed it;
// the changed channel closes exactly when the mode changes.
func TestModeChangeIsSignalledOnlyOnChange(t *testing.T) {
	t.Parallel()
	l := newLifecycle(nil)
	m, ch := l.watch()
	if m != modeServing || isClosed(ch) {
		t.Fatalf("a new worker is %v, changed closed %v", m, isClosed(ch))
	}
	if before, moved := l.ask(modeDraining); before != modeServing || !moved {
		t.Fatalf("a drain from serving: before %v, moved %v", before, moved)
	}
	if !isClosed(ch) {
		t.Fatal("the drain did not signal a change")
	}
	m, ch = l.watch()
	if before, moved := l.ask(modeReloading); before != modeDraining || moved {
		t.Fatalf("a reload while draining: before %v, moved %v", before, moved)
	}
	if before, moved := l.ask(modeDraining); before != modeDraining || moved {
		t.Fatalf("a second drain: before %v, moved %v", before, moved)
	}
	if isClosed(ch) || m != modeDraining {
		t.Fatalf("requests that changed nothing signalled a change (mode %v)", m)
	}
	l.ask(modeStopping)
	if !isClosed(ch) || l.mode() != modeStopping {
		t.Fatal("a stop while draining did not move the worker to stopping")
	}
}

// What each mode means for calls: which decline new calls, which stop
// running ones, and what status shows.
func TestModeMeaning(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		m                 mode
		shown             string
		declining, ending bool
	}{
		{modeServing, "serving", false, false},
		{modeReloading, "reloading", true, false},
		{modeDraining, "draining", true, false},
		{modeStopping, "stopping", true, true},
		{modeKilling, "killing", true, true},
	} {
		if c.m.String() != c.shown || c.m.declining() != c.declining || c.m.ending() != c.ending {
			t.Errorf("%v: shown %q declining %v ending %v, want %q %v %v",
				c.m, c.m.String(), c.m.declining(), c.m.ending(), c.shown, c.declining, c.ending)
		}
	}
}

// What `status` shows for each mode and connection: leaving (refused,
// stopped) first, then a mode other than serving, then the connection.
func TestStateShown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    state
		want string
	}{
		{state{modeServing, linkConnecting}, status.StateConnecting},
		{state{modeServing, linkAttached}, status.StateAttached},
		{state{modeDraining, linkConnecting}, status.StateDraining},
		{state{modeDraining, linkAttached}, status.StateDraining},
		{state{modeReloading, linkConnecting}, status.StateReloading},
		{state{modeStopping, linkAttached}, status.StateStopping},
		{state{modeKilling, linkAttached}, status.StateKilling},
		{state{modeServing, linkRefused}, status.StateRefused},
		{state{modeDraining, linkRefused}, status.StateRefused},
		{state{modeReloading, linkEnded}, status.StateStopped},
		{state{modeKilling, linkEnded}, status.StateStopped},
	} {
		if got := c.s.String(); got != c.want {
			t.Errorf("mode %v, link %d: shown %q, want %q", c.s.mode, c.s.link, got, c.want)
		}
	}
}

// The status file shows every change of the state as it happens, with
// what goes with it: a drain asked while the worker is reconnecting shows
// as draining (not connecting), the name goes with the connection, the
// last error stays for a refusal, and nothing moves an ended worker.
func TestStatusFileFollowsTheState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := status.NewFile(dir, status.Status{PID: os.Getpid()}, logging.NewRedactor(""), func(err error) { t.Errorf("status write: %v", err) })
	l := newLifecycle(file)
	shows := func(what, state, name, lastErr string) {
		t.Helper()
		file.Flush()
		st, err := status.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != state || st.Name != name || st.LastError != lastErr {
			t.Errorf("%s: the status file shows state %q, name %q, last error %q; want %q, %q, %q",
				what, st.State, st.Name, st.LastError, state, name, lastErr)
		}
	}
	shows("a new worker", status.StateConnecting, "", "")

	_, changed := l.watch()
	l.attached("gpu-01", time.Now())
	if !isClosed(changed) {
		t.Error("attaching did not signal a change")
	}
	shows("welcomed", status.StateAttached, "gpu-01", "")

	l.connecting("connection lost: EOF", time.Now(), 0)
	shows("the connection lost", status.StateConnecting, "", "connection lost: EOF")

	l.ask(modeDraining)
	shows("a drain while reconnecting", status.StateDraining, "", "connection lost: EOF")
	l.attached("gpu-01", time.Now())
	shows("a drain after reattaching", status.StateDraining, "gpu-01", "")

	l.refused("refused: unknown token")
	shows("refused", status.StateRefused, "gpu-01", "refused: unknown token")
	l.ended("")
	shows("ended after a refusal", status.StateStopped, "gpu-01", "refused: unknown token")

	_, changed = l.watch()
	l.attached("gpu-02", time.Now())
	l.ask(modeKilling) // the mode still moves; what is shown does not
	shows("after the end", status.StateStopped, "gpu-01", "refused: unknown token")
	l.mu.Lock()
	now := l.now
	l.mu.Unlock()
	if now != (state{modeKilling, linkEnded}) {
		t.Errorf("after the end: state %+v", now)
	}
	if !isClosed(changed) {
		t.Error("a kill after the end did not signal a change")
	}
}

// A reload that could not execute the binary ends the worker with why.
func TestEndedSaysWhy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := status.NewFile(dir, status.Status{}, logging.NewRedactor(""), nil)
	l := newLifecycle(file)
	l.attached("gpu-01", time.Now())
	l.ask(modeReloading)
	if got := file.Get().State; got != status.StateReloading {
		t.Errorf("a reload asked while attached shows %q, want reloading", got)
	}
	l.ended("reload: exec format error")
	if st := file.Get(); st.State != status.StateStopped || st.LastError != "reload: exec format error" {
		t.Errorf("a failed reload shows %q, %q", st.State, st.LastError)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A reload whose binary cannot be found ends the worker, and the status
// file says so (not "reloading" forever).
func TestReloadWithoutABinaryShowsStopped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := status.NewFile(dir, status.Status{}, logging.NewRedactor(""), nil)
	a := &Agent{log: slog.New(slog.DiscardHandler), status: file, life: newLifecycle(file)}
	a.life.attached("gpu-01", time.Now())
	a.life.ask(modeReloading)
	if code := a.reexec("", errors.New("cannot tell where this binary is"), func() { t.Error("told the service manager it reloads") }); code != config.ExitReloadFailed {
		t.Errorf("exit %d, want %d", code, config.ExitReloadFailed)
	}
	st, err := status.Read(dir)
	if err != nil || st.State != status.StateStopped || st.LastError != "reload: cannot tell where this binary is" {
		t.Errorf("the status file after a reload that could not start: %+v, %v", st, err)
	}
}
