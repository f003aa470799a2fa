package agent

// The worker's state as a whole, in one value: its mode (serving, or on
// its way out: reloading, draining, stopping, killing) and its connection
// to the engine (connecting, attached, refused, or ended). `status`, the
// status file, /healthz and the systemd status line all show the one
// String() of it.
//
// Signals and --max-calls ask for a mode; the worker is in the strongest
// mode asked, so one order decides what wins when requests meet:
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
//
// The connection moves freely between connecting and attached; refused and
// ended are said once the worker is leaving, and ended is final.

import (
	"sync"
	"time"

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
		return status.StateKilling
	}
	return "unknown"
}

// declining says whether new calls are declined in this mode.
func (m mode) declining() bool { return m != modeServing }

// ending says whether running calls are stopped in this mode.
func (m mode) ending() bool { return m >= modeStopping }

// link is the worker's connection to the engine.
type link uint8

const (
	linkConnecting link = iota // dialing: the first time, or again after a lost connection
	linkAttached               // the engine welcomed the worker
	linkRefused                // the engine will not have it, or the configuration is wrong
	linkEnded                  // the worker has stopped serving (final)
)

// state is the worker's mode and its connection, as one value.
type state struct {
	mode mode
	link link
}

// String is the state `status` shows: a refused or ended worker says so
// whatever its mode; otherwise a mode other than serving is what the
// worker is doing, attached or not (the name and last error say which);
// a serving worker shows its connection.
func (s state) String() string {
	switch {
	case s.link == linkEnded:
		return status.StateStopped
	case s.link == linkRefused:
		return status.StateRefused
	case s.mode != modeServing:
		return s.mode.String()
	case s.link == linkAttached:
		return status.StateAttached
	}
	return status.StateConnecting
}

// lifecycle holds the worker's state under its own lock, and is the one
// writer of the state the status file shows: every change is written
// there, with what goes with it (the name attached as, the last error),
// under that lock, so the file never shows an older state than the last
// change. The status file's lock is the only other one taken while it is
// held.
type lifecycle struct {
	mu      sync.Mutex
	now     state
	changed chan struct{} // closed (and replaced) when the state changes
	file    *status.File  // nil: kept in memory only
}

func newLifecycle(file *status.File) *lifecycle {
	l := &lifecycle{changed: make(chan struct{}), file: file}
	l.publish(nil)
	return l
}

// ask applies the precedence: the worker moves to m if m is stronger than
// its mode, and stays otherwise. It returns the mode before and whether
// it changed.
func (l *lifecycle) ask(m mode) (before mode, moved bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	before = l.now.mode
	if m <= before {
		return before, false
	}
	l.now.mode = m
	l.signal(nil)
	return before, true
}

// connecting says the worker is dialing again; lastErr is why the last
// connection or attempt ended, down since when it is not attached, after
// attempts failed attempts.
func (l *lifecycle) connecting(lastErr string, down time.Time, attempts int) {
	l.setLink(linkConnecting, func(s *status.Status) {
		s.Name, s.LastError, s.DownSince, s.Attempts = "", lastErr, down.UTC(), attempts
	})
}

// attached says the engine welcomed the worker as name.
func (l *lifecycle) attached(name string, since time.Time) {
	l.setLink(linkAttached, func(s *status.Status) {
		s.Name, s.Since, s.LastError, s.DownSince, s.Attempts = name, since.UTC(), "", time.Time{}, 0
	})
}

// refused says the engine will not have the worker, or its configuration
// is wrong: why.
func (l *lifecycle) refused(why string) {
	l.setLink(linkRefused, func(s *status.Status) { s.LastError = why })
}

// ended says the worker stopped serving; why, when not empty, replaces the
// last error.
func (l *lifecycle) ended(why string) {
	l.setLink(linkEnded, func(s *status.Status) {
		if why != "" {
			s.LastError = why
		}
	})
}

// setLink moves the connection to to, unless the worker has ended, and
// writes edit with it.
func (l *lifecycle) setLink(to link, edit func(*status.Status)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.now.link == linkEnded {
		return
	}
	l.now.link = to
	l.signal(edit)
}

// signal publishes the state, with edit, and wakes the watchers. l.mu is
// held.
func (l *lifecycle) signal(edit func(*status.Status)) {
	l.publish(edit)
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *lifecycle) publish(edit func(*status.Status)) {
	if l.file == nil {
		return
	}
	shown := l.now.String()
	l.file.Update(func(s *status.Status) {
		if edit != nil {
			edit(s)
		}
		s.State = shown
	})
}

// mode is the worker's mode now.
func (l *lifecycle) mode() mode {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.now.mode
}

// watch is the mode now and a channel closed when the state next changes
// (the mode or the connection: a watcher checks what it cares about).
func (l *lifecycle) watch() (mode, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.now.mode, l.changed
}
