package hook

// A hook is a shell command, but most are one script and its arguments
// ("/etc/fluksio-worker/gpu-check.sh --min-free 8GiB"). That script is a
// file the service must find and may run: a relative path, a path under a
// private /tmp or a file saved without its run bit would decline every
// call with "Permission denied" long after install said done. Program
// finds that file, so install, check and check-config look at it first.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// shellSpecial are the bytes that make a first word more than a plain path
// to the shell (quotes, expansions, redirections, operators): such a
// command is left alone, as the shell alone knows what it runs.
const shellSpecial = "\"'`$\\|&;<>(){}*?[]~#="

// Program is the file a hook command starts with when its first word is a
// plain path (it holds a slash, as a shell needs to run a file that is not
// on PATH), else "": a command name found on PATH (nvidia-smi) or a word
// the shell expands is not a file the worker can check.
func Program(command string) string {
	fields := strings.Fields(command)
	if len(fields) == 0 {
		return ""
	}
	word := fields[0]
	if !strings.Contains(word, "/") || strings.ContainsAny(word, shellSpecial) {
		return ""
	}
	return word
}

// ResolveProgram is command with a relative program (Program) made
// absolute against dir: "hooks/gpu.sh --x" in /etc/fluksio-worker's config
// is "/etc/fluksio-worker/hooks/gpu.sh --x", whatever directory the
// service starts in. Other commands are returned as they are.
func ResolveProgram(command, dir string) (string, error) {
	prog := Program(command)
	if prog == "" || filepath.IsAbs(prog) {
		return command, nil
	}
	abs, err := filepath.Abs(filepath.Join(dir, prog))
	if err != nil {
		return "", err
	}
	if strings.ContainsAny(abs, shellSpecial+" \t\n") {
		return "", fmt.Errorf("the hook's program %s is at %s, which a shell command cannot name without quotes; give its absolute path in quotes", prog, abs)
	}
	i := strings.Index(command, prog)
	return command[:i] + abs + command[i+len(prog):], nil
}

// CheckProgram says what would stop the hook's program from running as
// this process's account: missing, not a file, or without the run bit
// for it; nil for a command without one (Program) or one that can run.
// what names the hook for the error ("--pre-call-hook").
func CheckProgram(what, command string) error {
	prog := Program(command)
	if prog == "" {
		return nil
	}
	st, err := os.Stat(prog)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: its program %s does not exist; create it, or correct the path", what, prog)
	case err != nil:
		return fmt.Errorf("%s: %w", what, err)
	case st.IsDir():
		return fmt.Errorf("%s: its program %s is a directory; name the script in it", what, prog)
	case st.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s: its program %s has no run bit, so every call would be declined with 'Permission denied'; run: chmod +x %s", what, prog, prog)
	}
	if err := unix.Access(prog, unix.X_OK); err != nil {
		return fmt.Errorf("%s: its program %s cannot be run by this account (%v), so every call would be declined; make it runnable by the worker's account (chmod, chown, or the directories above it)", what, prog, err)
	}
	return nil
}
