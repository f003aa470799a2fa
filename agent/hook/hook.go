// Package hook runs the machine owner's call hooks (--pre-call-hook,
// --post-call-hook): a shell command given a call's metadata or outcome as
// JSON on stdin, bounded in time, and stopped whole (its process group)
// when its time is up, so a hook that hangs or leaves a child behind can
// neither hold a call nor outlive its bound.
package hook

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// pipeGrace is how long a hook's pipes may stay open once its shell has
// exited or been killed: a grandchild that kept stderr must not keep the
// hook's call waiting (exec.Cmd.WaitDelay).
const pipeGrace = time.Second

// maxStderr bounds what is kept of a hook's stderr: its first line is the
// reason, the rest is not read into memory.
const maxStderr = 4096

// Result is how a hook ended.
type Result struct {
	Exit     int    // its exit status; -1 when it was killed or did not start
	Reason   string // its first stderr line that is not blank, cut to 300 bytes
	Stderr   string // what it wrote on stderr, its first maxStderr bytes, to be logged whatever its exit
	TimedOut bool   // killed at its bound
	Err      error  // it could not start, or was killed
}

// OK says whether the hook exited 0.
func (r Result) OK() bool { return r.Err == nil && r.Exit == 0 }

// Run runs command with /bin/sh -c, input on its stdin and env added to
// the worker's own environment, and returns once it and every process of
// its group are gone or timeout has passed (then the group is killed).
// The input is one line: it is given a closing newline if it has none, so
// a hook that appends it to a file keeps one record a line and `read`
// sees it whole.
func Run(ctx context.Context, command string, input []byte, env []string, timeout time.Duration) Result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if len(input) > 0 && input[len(input)-1] != '\n' {
		input = append(input[:len(input):len(input)], '\n')
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Stdin = bytes.NewReader(input)
	cmd.Env = append(withoutSettings(cmd.Environ()), env...)
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	platform.NewProcessGroup(cmd)
	cmd.Cancel = func() error {
		platform.SignalGroup(cmd.Process.Pid, syscall.SIGKILL)
		return nil
	}
	cmd.WaitDelay = pipeGrace
	// Registered as a runner is: a subreaper worker reaps the zombies of
	// other process groups when a call ends, and one that took the shell's
	// would leave os/exec's wait "no child processes" and the hook no exit
	// status.
	err := platform.StartContained(cmd)
	if err == nil {
		err = cmd.Wait()
		platform.Forget(cmd.Process.Pid)
	}
	// Whatever the shell left in its group goes with it.
	if cmd.Process != nil {
		platform.SignalGroup(cmd.Process.Pid, syscall.SIGKILL)
	}
	r := Result{Exit: -1, Reason: firstLine(stderr.Bytes()), Stderr: strings.TrimSpace(string(stderr.Bytes()))}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.TimedOut = true
		r.Err = fmt.Errorf("the hook did not finish within %s and was killed", timeout)
	case ctx.Err() != nil:
		r.Err = fmt.Errorf("the hook was stopped: %w", ctx.Err())
	case err == nil:
		r.Exit = 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		r.Exit = exit.ExitCode()
	default:
		r.Err = fmt.Errorf("the hook could not run: %w", err)
	}
	return r
}

// withoutSettings drops the worker's own settings from a hook's
// environment: FLUKSIO_WORKER_TOKEN among them is the engine's secret.
func withoutSettings(env []string) []string {
	kept := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "FLUKSIO_WORKER_") {
			kept = append(kept, kv)
		}
	}
	return kept
}

func firstLine(b []byte) string {
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); line != "" {
			if len(line) > 300 {
				line = line[:300] + "…"
			}
			return line
		}
	}
	return ""
}

// limitedBuffer keeps the first maxStderr bytes written to it and
// discards the rest, so a hook that floods stderr cannot fill memory.
type limitedBuffer struct{ b bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxStderr - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (l *limitedBuffer) Bytes() []byte { return l.b.Bytes() }
