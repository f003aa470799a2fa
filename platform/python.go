package platform

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pythonCheckTimeout bounds the start-up check; a cold interpreter on a
// network filesystem can take seconds, but never this long.
const pythonCheckTimeout = 30 * time.Second

// venvDigestTimeout bounds `pip freeze`; past it the digest is "" (the
// engine then matches on labels alone), as with the Python agent.
const venvDigestTimeout = 60 * time.Second

// pipeWaitDelay: once the interpreter has exited (or its deadline passed),
// a process it left behind holding the output pipe gets this long before
// the pipe is closed under it; otherwise Wait would block for as long as
// that process lives.
const pipeWaitDelay = time.Second

// pythonVersionScript prints the interpreter's version and exits non-zero
// below 3.8, the oldest the embedded runtime supports. The check reads the
// version back and requires it to parse: a program that exits 0 without
// running the script (/bin/true, a wrapper that swallows its arguments) is
// not a Python.
const pythonVersionScript = `import sys; print("%d.%d.%d" % sys.version_info[:3]); sys.exit(0 if sys.version_info >= (3, 8) else 3)`

// FindPython resolves the interpreter node code runs on ("" means python3 on
// PATH) to an absolute path and checks that it starts, returning its
// version. The error says what to do.
func FindPython(ctx context.Context, given string) (path, version string, err error) {
	name := given
	if name == "" {
		name = "python3"
	}
	if st, err := os.Stat(name); err == nil && st.IsDir() {
		return "", "", pythonDirError(name)
	}
	path, err = exec.LookPath(name)
	if err != nil {
		if given == "" {
			return "", "", fmt.Errorf("no python3 on PATH: install Python 3.8 or newer, or pass --python /path/to/python")
		}
		return "", "", fmt.Errorf("--python %s: not found or not executable: %w", given, err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return "", "", err
	}
	version, err = checkPython(ctx, path, pythonCheckTimeout)
	if err != nil {
		return "", version, err
	}
	return path, version, nil
}

// pythonDirError says what to give instead of a directory, a virtual
// environment's or an installation's: the interpreter inside it.
func pythonDirError(dir string) error {
	for _, rel := range []string{"bin/python3", "bin/python"} {
		candidate := filepath.Join(dir, rel)
		if st, err := os.Stat(candidate); err == nil && !st.IsDir() {
			return fmt.Errorf("--python %s is a directory; did you mean %s?", dir, candidate)
		}
	}
	return fmt.Errorf("--python %s is a directory; give the interpreter, e.g. %s", dir, filepath.Join(dir, "bin", "python3"))
}

// checkPython runs the version script on path, in its own process group:
// on the timeout the whole group is killed, so a wrapper script that hangs
// leaves nothing behind, and so is anything the check left running.
func checkPython(ctx context.Context, path string, timeout time.Duration) (version string, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-c", pythonVersionScript)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	NewProcessGroup(cmd)
	cmd.Cancel = func() error {
		SignalGroup(cmd.Process.Pid, syscall.SIGKILL)
		return nil
	}
	cmd.WaitDelay = pipeWaitDelay
	// Registered as a runner is: in a group of its own, it would otherwise
	// be a child ReapOrphans may reap (a call ending meanwhile), and
	// os/exec's wait would fail with "no child processes".
	runErr := StartContained(cmd)
	if runErr == nil {
		runErr = cmd.Wait()
		Forget(cmd.Process.Pid)
	}
	if cmd.Process != nil {
		SignalGroup(cmd.Process.Pid, syscall.SIGKILL) // whatever it left behind
	}
	out := strings.TrimSpace(stdout.String())
	major, minor, parsed := parseVersion(out)
	if parsed {
		version = out
	}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return "", fmt.Errorf("%s did not finish the Python version check within %s (timed out; it was killed with everything it started): "+
			"pass --python with a working Python 3.8 or newer", path, timeout)
	case runErr == nil && parsed && (major > 3 || major == 3 && minor >= 8):
		return version, nil
	case parsed && (major < 3 || major == 3 && minor < 8):
		return version, fmt.Errorf("%s is Python %s; node code needs Python 3.8 or newer (pass --python)", path, version)
	case runErr == nil || errors.As(runErr, &exitErr) && exitErr.ExitCode() == 0:
		return "", fmt.Errorf("%s does not behave as Python: asked for its version, it printed %.80q; pass --python with a Python 3.8 or newer interpreter", path, out)
	default:
		// The last line of a traceback says what went wrong.
		detail := strings.TrimSpace(stderr.String())
		if detail != "" {
			detail = ": " + detail[strings.LastIndexByte(detail, '\n')+1:]
		}
		return "", fmt.Errorf("%s does not run as Python (%v%s); pass --python with a working interpreter", path, runErr, detail)
	}
}

// parseVersion reads "MAJOR.MINOR.MICRO", all three decimal numbers, as
// the version script prints it.
func parseVersion(s string) (major, minor int, ok bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || p != strconv.Itoa(v) {
			return 0, 0, false
		}
		n[i] = v
	}
	return n[0], n[1], true
}

// VenvDigest fingerprints what is installed for this Python, so the engine
// can tell when a worker's packages drifted: the first 16 hex characters of
// the SHA-256 of `pip freeze`'s stdout, whatever its exit status (a Python
// without pip hashes empty output), or "" when it cannot run in time.
func VenvDigest(ctx context.Context, python string) string {
	ctx, cancel := context.WithTimeout(ctx, venvDigestTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "pip", "freeze")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.WaitDelay = pipeWaitDelay
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && (!errors.As(err, &exitErr) || ctx.Err() != nil) {
		return ""
	}
	sum := sha256.Sum256(out.Bytes())
	return hex.EncodeToString(sum[:])[:16]
}
