package platform

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// pythonCheckTimeout bounds the start-up check; a cold interpreter on a
// network filesystem can take seconds, but never this long.
const pythonCheckTimeout = 30 * time.Second

// venvDigestTimeout is the reference agent's limit for `pip freeze`.
const venvDigestTimeout = 60 * time.Second

// pipeWaitDelay: once the interpreter has exited (or its deadline passed),
// a process it left behind holding the output pipe gets this long before
// the pipe is closed under it; otherwise Wait would block for as long as
// that process lives.
const pipeWaitDelay = time.Second

// pythonVersionScript prints the interpreter's version and exits non-zero
// below 3.8, the oldest the embedded runtime supports.
const pythonVersionScript = `import sys; print("%d.%d.%d" % sys.version_info[:3]); sys.exit(0 if sys.version_info >= (3, 8) else 3)`

// FindPython resolves the interpreter node code runs on ("" means python3 on
// PATH) to an absolute path and checks that it starts, returning its
// version. The error says what to do.
func FindPython(ctx context.Context, given string) (path, version string, err error) {
	name := given
	if name == "" {
		name = "python3"
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
	ctx, cancel := context.WithTimeout(ctx, pythonCheckTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-c", pythonVersionScript)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = pipeWaitDelay
	runErr := cmd.Run()
	version = strings.TrimSpace(stdout.String())
	var exitErr *exec.ExitError
	switch {
	case runErr == nil:
		return path, version, nil
	case errors.As(runErr, &exitErr) && exitErr.ExitCode() == 3:
		return "", version, fmt.Errorf("%s is Python %s; node code needs Python 3.8 or newer (pass --python)", path, version)
	default:
		detail := strings.TrimSpace(stderr.String())
		if detail != "" {
			detail = ": " + lastLine(detail)
		}
		return "", "", fmt.Errorf("%s does not run as Python (%v%s); pass --python with a working interpreter", path, runErr, detail)
	}
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

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
