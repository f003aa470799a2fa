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

	"golang.org/x/sys/unix"
)

// A call's private directory, <state-dir>/calls/call-XXXX (0700), made
// before its runner starts and removed once the call's processes are gone,
// or emptied for a later call where that is safe (callDirs).
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
	// listing is the directory open, from the first time it was emptied
	// for reuse to its removal: it is listed through it, rewound, at every
	// reuse rather than opened again (an open, a close and the poller's
	// look at a new file a call). Its device and inode tell the directory
	// apart from one put in its place since.
	listing  int
	listed   bool // listing is open
	dev, ino uint64
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
		callDirEnv+"="+d.path,
		cancelGraceEnv+"="+strconv.FormatFloat(grace.Seconds(), 'f', -1, 64))
}

// remove deletes the directory, including what node code left read-only.
func (d *callDir) remove() error {
	if d.listed {
		unix.Close(d.listing)
		d.listed = false
	}
	return removeTree(d.path)
}

// callDirs keeps call directories emptied after their call for the next
// calls. Making a directory and removing it again for every call cost 12 %
// of the worker's CPU dispatching eight calls at once (ext4 looks through
// the inodes deleted lately to allocate one, and the calls share the
// parent's lock); emptying one does not. Only a directory nothing of its
// call can reach any more is kept (its cgroup was found empty), and only
// while it is still this user's private, plain directory.
type callDirs struct{ kept[*callDir] }

// newCallDir is a call directory: an emptied one when the pool keeps
// one, else a new one.
func (c *Config) newCallDir() (*callDir, error) {
	if c.dirs != nil {
		if d, ok := c.dirs.take(); ok {
			return d, nil
		}
	}
	return newCallDir(c.StateDir)
}

// recycle empties d and keeps it for another call when reusable (nothing
// of its call runs), else removes it.
func (cd *callDirs) recycle(d *callDir, reusable bool) error {
	if !reusable || !d.empty() || !cd.put(d) {
		return d.remove()
	}
	return nil
}

// close removes the directories kept, and keeps none after.
func (cd *callDirs) close() {
	for _, d := range cd.kept.close() {
		d.remove()
	}
}

// empty removes everything in the directory and reports whether it is
// fit for another call: still the directory it was (not a link node code
// put in its place, nor one moved there), this user's, mode 0700, without
// an ACL (one node code set would outlive it), nothing in it.
func (d *callDir) empty() bool {
	// Checked before the chmod, which would follow a link.
	var st unix.Stat_t
	if unix.Lstat(d.path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() {
		return false
	}
	if d.listed && (uint64(st.Dev) != d.dev || st.Ino != d.ino) {
		return false
	}
	if st.Mode&0o7777 != 0o700 && os.Chmod(d.path, 0o700) != nil {
		return false
	}
	if !noXattrs(d.path) {
		for _, acl := range []string{"system.posix_acl_access", "system.posix_acl_default"} {
			if _, err := unix.Lgetxattr(d.path, acl, nil); err == nil {
				return false
			}
		}
	}
	names, err := d.list(&st)
	if err != nil {
		return false
	}
	if len(names) == 0 {
		return true
	}
	for _, name := range names {
		if removeTree(filepath.Join(d.path, name)) != nil {
			return false
		}
	}
	left, err := d.list(&st)
	return err == nil && len(left) == 0
}

// removeTree removes path and what is under it, including what node code
// left read-only. What is writable (nearly always) goes at the first try:
// making every directory writable first would read the whole tree twice,
// which was a third of the worker's own CPU per warm call (the runtime
// leaves a few directories in its call directory).
func removeTree(path string) error {
	if os.RemoveAll(path) == nil {
		return nil
	}
	unlockTree(path)
	return os.RemoveAll(path)
}

// unlockTree makes the directories under root, root included, writable
// by their owner, so that what node code left read-only can be removed.
func unlockTree(root string) {
	filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			os.Chmod(path, 0o700)
		}
		return nil
	})
}
