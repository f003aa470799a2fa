package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// The state directory holds the runner script every call executes, so it
// is as sensitive as the worker's own binary: a user who can write there
// runs code as the worker's account. The worker therefore keeps it private
// (0700) and, like ssh with ~/.ssh, refuses to start with one that another
// user owns or may write, or that sits in a directory every user may write
// without the sticky bit (where it could be swapped for another). It never
// falls back to a shared directory such as /tmp, where another user could
// create it first.

// stateSubdirs are the directories the worker keeps in its state directory:
// the runner scripts (runtime/<sha256>.py) and the artifacts node code
// loads (FLUKSIO_ARTIFACT_CACHE).
var stateSubdirs = []string{"runtime", "artifacts"}

// StateDirOf is the state directory cfg names, as ResolveStateDir picks
// it, without creating or checking anything: for `status`, which reads a
// worker's status file there.
func StateDirOf(cfg Config, getenv func(string) string) (string, error) {
	dir := cfg.StateDir
	if dir == "" {
		dir, _, _ = strings.Cut(getenv("STATE_DIRECTORY"), ":")
	}
	if dir == "" {
		cache, err := userCacheDir(getenv)
		if err != nil {
			return "", &UsageError{err}
		}
		dir = filepath.Join(cache, "fluksio-worker")
	}
	return dir, nil
}

// ResolveStateDir picks where the runtime cache and status file live:
// --state-dir (made absolute, since node processes get paths in it), else
// systemd's $STATE_DIRECTORY, else the user's cache directory; with none of
// those it is a usage error naming --state-dir. It creates the directory
// and its subdirectories private, checks they are, and returns the
// directory with symbolic links resolved.
func ResolveStateDir(cfg Config, getenv func(string) string) (string, error) {
	dir, err := StateDirOf(cfg, getenv)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", Usagef("the state directory %s: %v (set --state-dir to an absolute path)", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", Usagef("cannot create the state directory %s: %v (set --state-dir to a directory this user can create)", abs, err)
	}
	// Checked and used from here on by its real path, so a symbolic link
	// changed later does not move the worker elsewhere.
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return "", Usagef("the state directory %s: %v (set --state-dir)", dir, err)
	}
	if err := checkPrivateDir(abs, "the state directory"); err != nil {
		return "", err
	}
	if err := checkAncestors(abs, "the state directory "+abs, "set --state-dir to a directory under one only you (or root) control"); err != nil {
		return "", err
	}
	for _, sub := range stateSubdirs {
		if err := PrivateSubdir(filepath.Join(abs, sub)); err != nil {
			return "", err
		}
	}
	// The runner script and the status file are written here; find out now
	// rather than at the first connection.
	probe, err := os.CreateTemp(abs, ".write-check-*")
	if err != nil {
		return "", Usagef("cannot write to the state directory %s: %v (set --state-dir to a writable directory)", abs, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return abs, nil
}

// userCacheDir is os.UserCacheDir read through getenv, without any
// fallback: the worker's state must not land in a directory others share.
func userCacheDir(getenv func(string) string) (string, error) {
	if runtime.GOOS != "darwin" {
		if xdg := getenv("XDG_CACHE_HOME"); filepath.IsAbs(xdg) {
			return xdg, nil
		}
	}
	home := getenv("HOME")
	if home == "" {
		return "", errors.New("no private place for the worker's state: HOME, STATE_DIRECTORY and XDG_CACHE_HOME are all unset; give a directory only this user can write with --state-dir DIR (or FLUKSIO_WORKER_STATE_DIR)")
	}
	if runtime.GOOS == "darwin" {
		return filepath.Join(home, "Library", "Caches"), nil
	}
	return filepath.Join(home, ".cache"), nil
}

// PrivateSubdir creates dir 0700 if it is missing and checks it is private.
func PrivateSubdir(dir string) error {
	what := "the " + filepath.Base(dir) + " cache"
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return Usagef("cannot create %s %s: %v (set --state-dir to a writable directory)", what, dir, err)
	}
	return checkPrivateDir(dir, what)
}

// checkPrivateDir refuses a directory (not a link to one) that is not this
// user's, or that others may write, saying how to fix it.
func checkPrivateDir(dir, what string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return Usagef("%s %s: %v (set --state-dir)", what, dir, err)
	}
	if !st.IsDir() {
		return Usagef("%s %s is not a directory (%s); remove it, or set --state-dir to another directory", what, dir, st.Mode().Type())
	}
	uid := os.Geteuid()
	if owner, ok := FileOwner(st); ok && owner != uid {
		return Usagef("%s %s belongs to uid %d, not to uid %d that this worker runs as, so that user could plant code the worker runs. "+
			"Use a directory of your own (--state-dir DIR), or, if it is meant for this worker, remove it and let the worker create it", what, dir, owner, uid)
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 {
		return Usagef("%s %s is mode %04o: users other than its owner may write in it and plant code the worker runs. Make it private: chmod 700 %s (or set --state-dir to another directory)", what, dir, perm, dir)
	}
	return nil
}

// FileOwner is the uid owning a file, where the system says.
func FileOwner(st fs.FileInfo) (int, bool) {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(sys.Uid), true
	}
	return 0, false
}
