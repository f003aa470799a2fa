package config

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Who may change what decides the code the worker runs: the state
// directory (the runner script), the public keys of --trust-key (whose
// signatures let source run) and the call hooks' programs. A user other
// than root and the worker's own who may write one of them, or a directory
// above it, can make the worker run their code; so, like ssh with ~/.ssh
// and authorized_keys, the worker refuses to start with one, saying what
// to change. Root may write anything anyway, and the worker's own user is
// the one whose code runs.

// checkAncestors refuses path inside a directory that another user owns
// (other than root), or that users other than its owner may write without
// the sticky bit: there path could be renamed away and replaced. what
// names path for the message, fix says what to change.
func checkAncestors(path, what, fix string) error {
	uid := os.Geteuid()
	for parent := filepath.Dir(path); ; parent = filepath.Dir(parent) {
		st, err := os.Stat(parent)
		owner, ok := 0, false
		perm := fs.FileMode(0)
		if err == nil { // a missing one (a hook not made yet) is judged above it
			owner, ok = FileOwner(st)
			perm = st.Mode()
		}
		switch {
		case ok && owner != uid && owner != 0:
			return Usagef("%s is inside %s, which belongs to uid %d, who could replace it and plant code the worker runs; %s", what, parent, owner, fix)
		case perm.Perm()&0o002 != 0 && perm&fs.ModeSticky == 0:
			return Usagef("%s is inside %s, which every user may write (mode %04o, no sticky bit), so it could be replaced; %s", what, parent, perm.Perm(), fix)
		case perm.Perm()&0o020 != 0 && perm&fs.ModeSticky == 0:
			return Usagef("%s is inside %s, which its group's users may write (mode %04o, no sticky bit), so it could be replaced; chmod g-w %s, or %s", what, parent, perm.Perm(), parent, fix)
		}
		if parent == filepath.Dir(parent) {
			return nil
		}
	}
}

// checkOthersCannotWrite refuses a file or directory that decides what
// the worker runs (a key, a key directory, a hook's program) when a user
// other than root and the worker's may change it: it belongs to another
// user, users other than its owner may write it (in a directory, the
// sticky bit does not stop them adding a file), or a directory above it
// lets it be replaced. A symbolic link is judged where it lives and where
// it leads. what names path for the message ("--trust-key /etc/keys").
func checkOthersCannotWrite(path, what string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Usagef("%s: %v", what, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return Usagef("%s: %v", what, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return Usagef("%s: %v", what, err)
	}
	uid := os.Geteuid()
	if owner, ok := FileOwner(st); ok && owner != uid && owner != 0 {
		return Usagef("%s: %s belongs to uid %d, who could make the worker run their code; make it root's or this worker's (uid %d): chown %d %s, or use a copy only root or uid %d may write",
			what, real, owner, uid, uid, real, uid)
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 {
		return Usagef("%s: %s is mode %04o, so users other than its owner may change it and make the worker run their code; chmod go-w %s", what, real, perm, real)
	}
	fix := "make every directory above it writable only by root or uid " + fmt.Sprint(uid) + ", or move it under one that is"
	if err := checkAncestors(real, what, fix); err != nil {
		return err
	}
	if real != abs {
		return checkAncestors(abs, what, fix)
	}
	return nil
}
