package agent

// The worker's mode as a whole: serving, or on its way out (reloading,
// draining, stopping, killing). Signals and --max-calls ask for a mode;
// the worker is in the strongest mode asked, so one order decides what
// wins when requests meet:
//
//   - a reload is the weakest: a drain, stop or kill asked during a reload
//     overrules it (the worker exits without re-executing), and a reload
//     asked during one of them is ignored: the operator already said the
//     worker is to go. A second reload while one waits does nothing more.
//   - a drain lets running calls finish; a stop during a drain stops them.
//   - a kill (a second stop signal) overrules everything.
//
// Each mode is final until a stronger one is asked: nothing goes back to
// serving except by a reload re-executing the binary.

import (
	"sync"

	"github.com/fluksio/fluksio-worker/agent/status"
)

// mode is what the worker does with calls. The order is the precedence:
// a stronger mode overrules a weaker one.
type mode uint8

const (
	modeServing   mode = iota // takes calls
	modeReloading             // declines new calls, re-executes once the running ones end
	modeDraining              // declines new calls, exits once the running ones end
	modeStopping              // stops the running calls, then exits
	modeKilling               // kills every call's process group, exits now
)

// String is the mode as `status` and the status file show it.
func (m mode) String() string {
	switch m {
	case modeServing:
		return "serving"
	case modeReloading:
		return status.StateReloading
	case modeDraining:
		return status.StateDraining
	case modeStopping:
		return status.StateStopping
	case modeKilling:
		return "killing"
	}
	return "unknown"
}

// declining says whether new calls are declined in this mode.
func (m mode) declining() bool { return m != modeServing }

// ending says whether running calls are stopped in this mode.
func (m mode) ending() bool { return m >= modeStopping }

// lifecycle holds the worker's mode, under its own lock; no other lock is
// taken while it is held.
type lifecycle struct {
	mu      sync.Mutex
	now     mode
	changed chan struct{} // closed (and replaced) when the mode changes
}

func newLifecycle() *lifecycle { return &lifecycle{changed: make(chan struct{})} }

// ask applies the precedence: the worker moves to m if m is stronger than
// its mode, and stays otherwise. It returns the mode before and whether
// it changed.
func (l *lifecycle) ask(m mode) (before mode, moved bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	before = l.now
	if m <= before {
		return before, false
	}
	l.now = m
	close(l.changed)
	l.changed = make(chan struct{})
	return before, true
}

// mode is the worker's mode now.
func (l *lifecycle) mode() mode {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.now
}

// watch is the mode now and a channel closed when it next changes.
func (l *lifecycle) watch() (mode, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.now, l.changed
}
