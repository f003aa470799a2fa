package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/platform"
)

// Status is what the running worker says about itself in
// <state-dir>/status.json, for `fluksio-worker status` to show. It never
// holds the token.
type Status struct {
	PID          int           `json:"pid"`
	Version      string        `json:"version"`
	Engine       string        `json:"engine"`
	State        string        `json:"state"` // connecting, attached, draining, reloading, stopping, stopped
	Name         string        `json:"name,omitempty"`
	Since        time.Time     `json:"since,omitzero"`
	CallsRunning int           `json:"calls_running"`
	CallsQueued  int           `json:"calls_queued"` // waiting for one of the --parallel slots
	CallsDone    int64         `json:"calls_done"`
	LastError    string        `json:"last_error,omitempty"`
	Reload       *ReloadStatus `json:"reload,omitempty"`      // a reload waiting for calls
	Listen       string        `json:"listen,omitempty"`      // where /metrics and /healthz are served
	Containment  string        `json:"containment,omitempty"` // how calls' processes are kept together (contain.go)
	Updated      time.Time     `json:"updated"`
}

// StatusPath is where the worker with this state directory keeps its status.
func StatusPath(stateDir string) string { return filepath.Join(stateDir, "status.json") }

// ReadStatus reads the status a worker left in stateDir.
func ReadStatus(stateDir string) (Status, error) {
	var st Status
	b, err := os.ReadFile(StatusPath(stateDir))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("reading %s: %w", StatusPath(stateDir), err)
	}
	return st, nil
}

// statusInterval bounds how often the status file is rewritten: a worker
// doing hundreds of calls a second must not spend its time renaming files.
const statusInterval = time.Second

// statusFile keeps Status on disk, written atomically, at most once per
// statusInterval; Flush writes what is pending at once.
type statusFile struct {
	path    string
	mu      sync.Mutex
	st      Status
	last    time.Time
	pending *time.Timer
	onError func(error)
	// redact scrubs the token from the text fields: a last error may quote
	// an engine's page that echoes the request URL.
	redact *logging.Redactor
}

func newStatusFile(stateDir string, st Status, onError func(error)) *statusFile {
	s := &statusFile{path: StatusPath(stateDir), st: st, onError: onError}
	s.Update(func(*Status) {})
	return s
}

// Update changes the status and schedules a write.
func (s *statusFile) Update(change func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	change(&s.st)
	if s.pending != nil {
		return
	}
	wait := statusInterval - time.Since(s.last)
	if wait <= 0 {
		s.writeLocked()
		return
	}
	s.pending = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pending = nil
		s.writeLocked()
	})
}

// Get returns the current status.
func (s *statusFile) Get() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// Flush writes the current status now.
func (s *statusFile) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != nil {
		s.pending.Stop()
		s.pending = nil
	}
	s.writeLocked()
}

func (s *statusFile) writeLocked() {
	s.last = time.Now()
	s.st.Updated = s.last.UTC()
	shown := s.st
	shown.Engine = logging.ShownURL(shown.Engine)
	shown.LastError = s.redact.Scrub(shown.LastError)
	shown.Name = s.redact.Scrub(shown.Name)
	b, _ := json.MarshalIndent(shown, "", "  ")
	// Private like everything in the state directory; `status` reads it
	// as the service account or root.
	if err := platform.WriteFileAtomic(s.path, append(b, '\n'), 0o600, platform.KeepOwner); err != nil && s.onError != nil {
		s.onError(err)
	}
}
