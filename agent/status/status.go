// Package status owns the status file a running worker keeps in its
// state directory (status.json): what state it is in, its engine, its
// calls, a reload it waits on, and its last error, never the token. The
// worker writes it atomically at most once a second; `fluksio-worker
// status`, `check` and the health probe read it.
package status

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/platform"
)

// The worker's states as the status file and `status` show them (the
// String() of the agent's state, agent/mode.go): stopped or refused once
// the worker is leaving; else its mode when it is not serving (reloading,
// draining, stopping, killing), attached or not; else its connection's.
const (
	StateConnecting = "connecting" // dialing, or retrying after a lost connection
	StateAttached   = "attached"   // the engine welcomed it; it takes calls
	StateReloading  = "reloading"  // a reload waits for the running calls
	StateDraining   = "draining"   // running calls finish, new ones are declined
	StateStopping   = "stopping"   // running calls are being stopped
	StateKilling    = "killing"    // a second stop signal: every call's processes are killed
	StateRefused    = "refused"    // the engine will not have it (or the config is wrong)
	StateStopped    = "stopped"    // it exited
)

// Status is what the running worker says about itself in
// <state-dir>/status.json, for `fluksio-worker status` to show. It never
// holds the token.
type Status struct {
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Engine  string    `json:"engine"`
	State   string    `json:"state"` // one of the State* constants
	Name    string    `json:"name,omitempty"`
	Since   time.Time `json:"since,omitzero"`
	// DownSince is when a worker that is not attached lost its connection,
	// or started; Attempts, the attempts to attach that failed since.
	DownSince    time.Time `json:"down_since,omitzero"`
	Attempts     int       `json:"attempts,omitempty"`
	CallsRunning int       `json:"calls_running"`
	CallsQueued  int       `json:"calls_queued"` // waiting for one of the --parallel slots
	CallsDone    int64     `json:"calls_done"`
	Held         *Held     `json:"held,omitempty"` // calls running through an outage (resume extension)
	LastError    string    `json:"last_error,omitempty"`
	Reload       *Reload   `json:"reload,omitempty"` // a reload waiting for calls
	// ReloadRefused: the last reload asked was refused, the binary on disk
	// not accepting the configuration; the worker serves on as it was.
	ReloadRefused *ReloadRefused `json:"reload_refused,omitempty"`
	Listen        string         `json:"listen,omitempty"`      // where /metrics, /healthz and /livez are served
	Containment   string         `json:"containment,omitempty"` // how calls' processes are kept together (runner.SetupContainment)
	Sandbox       string         `json:"sandbox,omitempty"`     // "on", or "off: why, what to change" (runner.SetupSandbox)
	Policy        string         `json:"policy,omitempty"`      // the code policy and call hooks in force (config.Config.PolicyText)
	Warm          string         `json:"warm,omitempty"`        // what --warm keeps, said as runner.WarmShown says it
	WarmDetail    string         `json:"warm_detail,omitempty"` // how, said as runner.WarmDetail says it
	Limits        string         `json:"limits,omitempty"`      // the limits in force (config.Config.LimitsText)
	// CallsDeclined counts the calls answered without running, by the
	// reason calls_declined_total counts them under (policy, disk, …).
	CallsDeclined map[string]int64 `json:"calls_declined,omitempty"`
	// Exit is how the worker ended: its reason and exit code, as its last
	// log record and systemd's last STATUS= say them; nil while it runs.
	Exit    *Exit     `json:"exit,omitempty"`
	Updated time.Time `json:"updated"`
}

// Held is what the worker holds through an outage of its connection to an
// engine that accepted the resume extension.
type Held struct {
	Calls    []string  `json:"calls"`    // their call ids
	Since    time.Time `json:"since"`    // when the oldest hold began
	Deadline time.Time `json:"deadline"` // when the first of them is stopped unless the engine claims it
	Memory   int64     `json:"memory_bytes"`
	Disk     int64     `json:"disk_bytes"` // spill files in the state directory
}

// Path is where the worker with this state directory keeps its status.
func Path(stateDir string) string { return filepath.Join(stateDir, "status.json") }

// Read reads the status a worker left in stateDir.
func Read(stateDir string) (Status, error) {
	var st Status
	b, err := os.ReadFile(Path(stateDir))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("reading %s: %w", Path(stateDir), err)
	}
	return st, nil
}

// writeInterval bounds how often the status file is rewritten: a worker
// doing hundreds of calls a second must not spend its time renaming files.
const writeInterval = time.Second

// settleMargin is how long past a pending write's due time ReadSettled
// waits: the timer's own delay and an atomic rename, well under this.
const settleMargin = 200 * time.Millisecond

// ReadSettled is Read for a person asking now. A running worker rewrites
// its status at most once per writeInterval, so a file written less than
// that ago may have a change pending: the calls that ended since (status
// said "1 running, 0 done" right after three answers). It waits until such
// a write is due, at most writeInterval, and reads again.
func ReadSettled(stateDir string) (Status, error) {
	st, err := Read(stateDir)
	if err != nil || st.State == StateStopped || st.Exit != nil {
		return st, err
	}
	if wait := time.Until(st.Updated.Add(writeInterval + settleMargin)); wait > 0 && wait <= writeInterval+settleMargin {
		time.Sleep(wait)
		return Read(stateDir)
	}
	return st, err
}

// File keeps Status on disk, written atomically, at most once per
// writeInterval; Flush writes what is pending at once.
type File struct {
	path    string
	mu      sync.Mutex
	st      Status
	last    time.Time
	pending *time.Timer
	closed  bool // Close wrote the last status: nothing is written after it
	onError func(error)
	// redact scrubs the token from the text fields: a last error may quote
	// an engine's page that echoes the request URL.
	redact *logging.Redactor
}

// NewFile starts keeping st in stateDir's status file; redact scrubs its
// text fields, and onError, when set, hears of failed writes.
func NewFile(stateDir string, st Status, redact *logging.Redactor, onError func(error)) *File {
	s := &File{path: Path(stateDir), st: st, redact: redact, onError: onError}
	s.Update(func(*Status) {})
	return s
}

// Update changes the status and schedules a write.
func (s *File) Update(change func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	change(&s.st)
	if s.pending != nil || s.closed {
		return
	}
	wait := writeInterval - time.Since(s.last)
	if wait <= 0 {
		s.writeLocked()
		return
	}
	s.pending = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		s.pending = nil
		s.writeLocked()
	})
}

// Get returns the current status.
func (s *File) Get() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.CallsDeclined = maps.Clone(st.CallsDeclined)
	return st
}

// Flush writes the current status now.
func (s *File) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != nil {
		s.pending.Stop()
		s.pending = nil
	}
	if !s.closed {
		s.writeLocked()
	}
}

// Close writes the current status a last time; later changes are kept in
// memory only. A worker on its way out closes it, so that nothing is
// written into its state directory once it has let the directory go.
func (s *File) Close() {
	s.Flush()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}

func (s *File) writeLocked() {
	s.last = time.Now()
	s.st.Updated = s.last.UTC()
	shown := s.st
	shown.Engine = logging.ShownURL(shown.Engine)
	shown.LastError = s.redact.Scrub(shown.LastError)
	shown.Name = s.redact.Scrub(shown.Name)
	if r := shown.ReloadRefused; r != nil {
		shown.ReloadRefused = &ReloadRefused{At: r.At, Reason: s.redact.Scrub(r.Reason)}
	}
	b, _ := json.MarshalIndent(shown, "", "  ")
	// Private like everything in the state directory; `status` reads it
	// as the service account or root.
	if err := platform.WriteFileAtomic(s.path, append(b, '\n'), 0o600, platform.KeepOwner); err != nil && s.onError != nil {
		s.onError(err)
	}
}

// Exit is how a worker ended.
type Exit struct {
	Code   int       `json:"code"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// ReloadRefused is a reload that was not done, and why.
type ReloadRefused struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// Reload is a waiting reload, in the status file.
type Reload struct {
	Since    time.Time `json:"since"`
	Deadline time.Time `json:"deadline,omitzero"` // zero: no --reload-timeout
	Waiting  []string  `json:"waiting"`           // the call_ids it waits for
}
