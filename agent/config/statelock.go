package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// One worker per state directory: two would share the call directories,
// the artifact cache and status.json, and each one's start-up cleanup
// would remove the other's files (SLURM array tasks on one node sharing
// ~/.cache/fluksio-worker do exactly that). A worker holds an advisory
// lock (flock) on <state-dir>/worker.lock for its whole life; the kernel
// lets go of it however the worker ends, so a worker killed outright
// leaves no stale lock. The file holds the holder's pid, for the message
// that refuses a second worker. Readers (status) take no lock.

// stateLockName is the lock file in the state directory.
const stateLockName = "worker.lock"

// StateLock is a held state directory lock.
type StateLock struct{ f *os.File }

// LockStateDir takes the state directory's lock, or refuses at once with
// a usage error naming the worker that holds it and what to do. The lock
// is let go on exec: a reload's re-executed worker takes it again at start.
func LockStateDir(dir string) (*StateLock, error) {
	path := filepath.Join(dir, stateLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, Usagef("cannot open the state directory's lock %s: %v (set --state-dir to a writable directory)", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, Usagef("cannot lock the state directory %s: %v", dir, err)
		}
		holder := "another worker"
		if pid := LockHolder(dir); pid > 0 {
			holder = fmt.Sprintf("another worker (pid %d)", pid)
		}
		return nil, Usagef("the state directory %s is in use by %s; each worker needs its own: give this one --state-dir DIR (for example one per GPU or per array task), or stop the other first", dir, holder)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &StateLock{f: f}, nil
}

// LockHolder is the pid written in the state directory's lock file by the
// worker that took it last (which may have ended since), or 0. It reads
// without locking, as status does.
func LockHolder(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, stateLockName))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Release lets go of the lock.
func (l *StateLock) Release() { l.f.Close() }
