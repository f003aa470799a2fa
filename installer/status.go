package installer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// StatusCommand is `fluksio-worker status`: the service manager's view and
// the worker's own (from the status file it keeps in its state directory).
// Exit status as systemctl's: 0 running, 3 stopped, 4 not installed.
func StatusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return showStatus(ctx, thisHost(), args, stdout, stderr)
}

func showStatus(_ context.Context, h host, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	userService := fs.Bool("user-service", false, "")
	if err := parseFlags(fs, args); err != nil {
		return usageExit(err, writeStatusUsage, stdout, stderr)
	}
	l, err := installedLayout(h, fs, *userService)
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker status: %v\n", err)
		return config.ExitFailed
	}
	if !exists(l.UnitPath) {
		fmt.Fprintf(stdout, "fluksio-worker is not installed as a service here (no %s).\nInstall it with: sudo fluksio-worker install --help\n", l.UnitPath)
		return config.ExitNotInstalled
	}
	m, err := newManager(l, "")
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker status: %v\n", err)
		return config.ExitFailed
	}
	state, err := m.State()
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker status: %v\n", err)
		return config.ExitFailed
	}
	st, stErr := status.Read(stateDirOf(l))
	st.LastError = tokenRedactor(l).Scrub(st.LastError)
	writeStatus(stdout, l, state, st, stErr)
	if state == Running {
		return config.ExitOK
	}
	return config.ExitStopped
}

// stateDirOf is where the installed worker keeps its status: the config's
// state-dir, or the layout's default where the config cannot be read (it is
// 0600, and status may be run without sudo).
func stateDirOf(l Layout) string {
	if values, err := config.ReadFile(l.ConfigPath); err == nil {
		if dir, ok := values["state-dir"].(string); ok && dir != "" {
			return dir
		}
	}
	return l.StateDir
}

// tokenRedactor scrubs the installed worker's token, where its config can
// be read; without it, token= parameters are still replaced.
func tokenRedactor(l Layout) *logging.Redactor {
	values, _ := config.ReadFile(l.ConfigPath)
	token, _ := values["token"].(string)
	return logging.NewRedactor(token)
}

// writeStatus prints the service's state and, where the status file could
// be read, what the worker says about itself.
func writeStatus(w io.Writer, l Layout, state State, st status.Status, stErr error) {
	fmt.Fprintf(w, "fluksio-worker: %s (%s)\n", state, l.Kind())
	row := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-9s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	row("service", "%s", l.UnitPath)
	row("config", "%s", l.ConfigPath)
	switch {
	case errors.Is(stErr, fs.ErrPermission):
		row("worker", "its status is readable by the service account and root only: run 'sudo fluksio-worker status'")
	case errors.Is(stErr, fs.ErrNotExist):
		row("worker", "no status yet (it has not started, or is older than this command)")
	case stErr != nil:
		row("worker", "cannot read its status: %v", stErr)
	default:
		writeWorker(row, state, st)
	}
	row("logs", "%s", l.LogHint())
}

func writeWorker(row func(label, format string, args ...any), state State, st status.Status) {
	now := time.Now()
	prefix := ""
	if state != Running {
		prefix = "last seen "
	}
	row("engine", "%s", logging.ShownURL(st.Engine))
	switch st.State {
	case "attached":
		since := ""
		if !st.Since.IsZero() {
			since = fmt.Sprintf(" since %s (%s)", st.Since.Local().Format("2006-01-02 15:04:05 MST"), ago(now, st.Since))
		}
		row("worker", "%sattached as %q%s", prefix, st.Name, since)
	case "connecting":
		row("worker", "%sconnecting to the engine (not attached)", prefix)
	case "reloading":
		row("worker", "%sreloading as %q", prefix, st.Name)
		if r := st.Reload; r != nil {
			limit := "no time limit (--reload-timeout)"
			if !r.Deadline.IsZero() {
				limit = "calls still running at " + r.Deadline.Local().Format("15:04:05") + " are stopped (--reload-timeout)"
			}
			row("reload", "asked %s; waiting for %s to finish; %s", ago(now, r.Since), strings.Join(r.Waiting, ", "), limit)
		}
	case "":
		row("worker", "%sunknown state", prefix)
	default:
		row("worker", "%s%s", prefix, st.State)
	}
	if r := st.ReloadRefused; r != nil {
		row("reload", "refused %s: %s", ago(now, r.At), r.Reason)
	}
	if st.CallsQueued > 0 {
		row("calls", "%d running, %d waiting for a slot, %d done", st.CallsRunning, st.CallsQueued, st.CallsDone)
	} else {
		row("calls", "%d running, %d done", st.CallsRunning, st.CallsDone)
	}
	if st.Listen != "" {
		row("monitor", "http://%s/metrics and /healthz", st.Listen)
	}
	if st.Containment != "" {
		row("contain", "%s", st.Containment)
	}
	if st.LastError != "" {
		// A status file written by an older worker may hold an engine's
		// page that echoed the request URL; its token= is not shown.
		row("error", "%s", strings.TrimSpace(logging.NewRedactor("").Scrub(st.LastError)))
	}
	row("process", "pid %d, fluksio-worker %s, status written %s", st.PID, st.Version, ago(now, st.Updated))
}

// ago says how long before now t was, to the second.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t).Round(time.Second)
	if d < time.Second {
		return "just now"
	}
	return d.String() + " ago"
}

// waitAttached watches a freshly started service until its worker says it
// is attached (in a status written after started), the service stops, or
// the wait runs out; it returns what it saw last.
func waitAttached(ctx context.Context, m *manager, stateDir string, started time.Time, wait time.Duration) (State, status.Status, error) {
	deadline := time.Now().Add(wait)
	// A status file from before the restart says nothing about this worker.
	fresh := started.Add(-time.Second)
	for {
		state, _ := m.State()
		st, err := status.Read(stateDir)
		if err == nil && st.Updated.Before(fresh) {
			err = fmt.Errorf("%w: the status file predates this start", fs.ErrNotExist)
		}
		// Attached since this start: a reload keeps the PID, and an old
		// status may have been written less than a second before.
		attached := err == nil && st.State == "attached" && !st.Since.Before(fresh)
		// A reload waiting for calls may wait for hours.
		waiting := err == nil && st.State == "reloading" && st.Reload != nil
		// systemd reports a unit that just failed as activating for a
		// moment, so a stop counts only after the first second.
		stopped := state != Running && time.Since(started) > time.Second
		if attached || waiting || stopped || time.Now().After(deadline) {
			return state, st, err
		}
		select {
		case <-ctx.Done():
			return state, st, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func writeStatusUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: fluksio-worker status [--user-service]

Shows whether the worker service is running, and what the worker says it is
doing: which engine, attached under which name since when, how many calls it
is running and has done, and its last error. The token is never shown.

Without sudo it shows the service's state; the worker's own status is
readable by the service account and root.

Options:
`)
	config.WriteOption(w, "--user-service", userServiceHelp)
	fmt.Fprint(w, `
Exit status, as systemctl's: 0 running, 3 stopped (or failed), 4 not installed.
`)
}
