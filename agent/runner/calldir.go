package runner

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"
)

// A call's private directory, <state-dir>/calls/call-XXXX (0700), made
// before its runner starts and removed once the call's processes are gone.
// The runner finds it as FLUKSIO_CALL_DIR and keeps shipped node source
// there (so child interpreters can import it). It is also the runner's
// working directory when the worker's own one is not writable, which is how
// a service runs (systemd starts it in /, read-only): training code writes
// relative paths (runs/, checkpoint.pt) and needs somewhere to put them. A
// worker started from a project directory keeps that directory, as a user
// running it by hand expects.
type callDir struct {
	path string
	cwd  string // the runner's working directory; "" keeps the worker's own
}

const callDirsName = "calls"

func newCallDir(stateDir string) (*callDir, error) {
	parent := filepath.Join(stateDir, callDirsName)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("creating the call's directory: %w (set --state-dir to a writable directory)", err)
	}
	path, err := os.MkdirTemp(parent, "call-")
	if err != nil {
		return nil, fmt.Errorf("creating the call's directory: %w (set --state-dir to a writable directory)", err)
	}
	d := &callDir{path: path}
	if !workingDirWritable() {
		d.cwd = path
	}
	return d, nil
}

// workingDirWritable reports whether the worker's own working directory
// takes new files. It is tried once, by creating and removing a file:
// permission bits do not tell root the truth (a read-only mount, /proc),
// and a project directory should not see a probe per call.
var workingDirWritable = sync.OnceValue(func() bool {
	wd, err := os.Getwd()
	if err != nil {
		return false
	}
	f, err := os.CreateTemp(wd, ".fluksio-worker-write-check-*")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
})

// env is the runner's environment: the call's own plus the call directory
// and the cancel grace, last so that a request's env cannot override them.
func (d *callDir) env(base []string, grace time.Duration) []string {
	return append(slices.Clip(base),
		"FLUKSIO_CALL_DIR="+d.path,
		"FLUKSIO_CANCEL_GRACE="+strconv.FormatFloat(grace.Seconds(), 'f', -1, 64))
}

// remove deletes the directory, including what node code left read-only.
func (d *callDir) remove() error {
	filepath.WalkDir(d.path, func(path string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(d.path)
}
