package agent

import (
	"testing"
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
		l := newLifecycle()
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
	l := newLifecycle()
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

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
