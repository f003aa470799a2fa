package installer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// StatusCommand is `fluksio-worker status`: the service manager's view and
// the worker's own (from the status file it keeps in its state directory);
// with --state-dir or --config, any worker's own view (a foreground, batch
// or Kubernetes worker). Exit status as systemctl's: 0 running, 3 stopped,
// 4 not installed (or no worker ever ran with that state directory).
func StatusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return showStatus(ctx, thisHost(), args, stdout, stderr)
}

func showStatus(_ context.Context, h host, args []string, stdout, stderr io.Writer) int {
	cmd := config.NewCommand("status", writeStatusUsage)
	userService := cmd.Bool("user-service", false, "")
	stateDir := cmd.String("state-dir", "", "")
	configPath := cmd.String("config", "", "")
	asJSON := cmd.Bool("json", false, "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	if *stateDir != "" || *configPath != "" {
		return showWorkerStatus(h, *stateDir, *configPath, *asJSON, stdout, stderr)
	}
	l, err := installedLayout(h, cmd, *userService)
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker status: %v\n", err)
		return config.ExitFailed
	}
	if !exists(l.UnitPath) {
		if *asJSON {
			writeJSON(stdout, statusReport{State: "not installed", Service: &serviceReport{Kind: l.Kind(), Unit: l.UnitPath}})
			return config.ExitNotInstalled
		}
		install := "sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token -"
		if l.UserService {
			install = "fluksio-worker install --user-service --url wss://ENGINE/api/v1/workers/attach --token -"
		}
		fmt.Fprintf(stdout, "fluksio-worker is not installed as a service here (no %s).\nInstall it with (it asks for the token):\n  %s\nA worker not run as a service: fluksio-worker status --state-dir DIR (or --config FILE).\n", l.UnitPath, install)
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
	st, stErr := status.ReadSettled(stateDirOf(l))
	st.LastError = tokenRedactor(l).Scrub(st.LastError)
	if *asJSON {
		r := statusReport{State: state.String(), Service: &serviceReport{Kind: l.Kind(), Unit: l.UnitPath, Config: l.ConfigPath}}
		r.setWorker(st, stErr)
		writeJSON(stdout, r)
	} else {
		writeStatus(stdout, l, state, st, stErr)
	}
	if state == Running {
		return config.ExitOK
	}
	return config.ExitStopped
}

// statusReport is `status --json`: for scripts and fleet tools, which
// read the worker's own fields as the status file has them.
type statusReport struct {
	State       string         `json:"state"` // running, stopped, not installed, or (for --state-dir) no status
	Service     *serviceReport `json:"service,omitempty"`
	StateDir    string         `json:"state_dir,omitempty"`
	Worker      *status.Status `json:"worker,omitempty"`
	WorkerError string         `json:"worker_error,omitempty"` // why the worker's status could not be read
}

type serviceReport struct {
	Kind   string `json:"kind"`
	Unit   string `json:"unit"`
	Config string `json:"config,omitempty"`
}

func (r *statusReport) setWorker(st status.Status, err error) {
	if err != nil {
		r.WorkerError = err.Error()
		return
	}
	r.Worker = &st
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// showWorkerStatus is status for a worker named by its state directory or
// its config file, however it runs: in the foreground, in a batch job, in
// a Kubernetes pod. Whether it runs is its status file's process, alive
// and not stopped.
func showWorkerStatus(h host, stateDir, configPath string, asJSON bool, stdout, stderr io.Writer) int {
	redact := logging.NewRedactor("")
	if stateDir == "" {
		cfg, err := config.Load([]string{"--config", configPath}, h.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "fluksio-worker status: %v\n", err)
			return config.ExitUsage
		}
		if stateDir, err = config.StateDirOf(cfg, h.Getenv); err != nil {
			fmt.Fprintf(stderr, "fluksio-worker status: %v\n", err)
			return config.ExitUsage
		}
		redact = logging.NewRedactor(cfg.Token)
	}
	st, err := status.ReadSettled(stateDir)
	st.LastError = redact.Scrub(st.LastError)
	running := err == nil && st.State != status.StateStopped && platform.ProcessAlive(st.PID)
	state, code := "running", config.ExitOK
	switch {
	case errors.Is(err, fs.ErrNotExist):
		state, code = "no status", config.ExitNotInstalled
	case !running:
		state, code = status.StateStopped, config.ExitStopped
	}
	if asJSON {
		r := statusReport{State: state, StateDir: stateDir}
		r.setWorker(st, err)
		writeJSON(stdout, r)
		return code
	}
	fmt.Fprintf(stdout, "fluksio-worker: %s (the worker with state directory %s)\n", state, stateDir)
	row := func(label, format string, args ...any) {
		fmt.Fprintf(stdout, "  %-9s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		row("worker", "no worker has run with this state directory (no %s)", status.Path(stateDir))
	case errors.Is(err, fs.ErrPermission):
		row("worker", "its status is readable by the worker's account and root only: run it as that account or with sudo")
	case err != nil:
		row("worker", "cannot read its status: %v", err)
	default:
		svc := Stopped
		if running {
			svc = Running
		}
		writeWorker(row, svc, st)
	}
	return code
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
	switch {
	case state != Running && st.Exit != nil:
		// The worker's own last word, as systemd's last STATUS= has it.
		row("worker", "stopped %s: %s (exit code %d)", ago(now, st.Exit.At), st.Exit.Reason, st.Exit.Code)
	default:
		writeWorkerState(row, prefix, now, st)
	}
	if r := st.ReloadRefused; r != nil {
		row("reload", "refused %s: %s", ago(now, r.At), r.Reason)
	}
	calls := fmt.Sprintf("%d running, %d done", st.CallsRunning, st.CallsDone)
	if st.CallsQueued > 0 {
		calls = fmt.Sprintf("%d running, %d waiting for a slot, %d done", st.CallsRunning, st.CallsQueued, st.CallsDone)
	}
	row("calls", "%s%s", calls, declinedText(st.CallsDeclined))
	if h := st.Held; h != nil {
		row("held", "%d call(s) held through an outage since %s (%s), output kept: %s in memory, %s on disk; stopped at %s unless the engine claims them (--outage-grace)",
			len(h.Calls), h.Since.Local().Format("15:04:05"), strings.Join(h.Calls, ", "),
			logging.HumanBytes(h.Memory), logging.HumanBytes(h.Disk), h.Deadline.Local().Format("15:04:05"))
	}
	if st.Listen != "" && state == Running {
		// A stopped worker serves nothing there.
		row("monitor", "http://%s/metrics, /healthz and /livez", st.Listen)
	}
	if st.Containment != "" {
		row("contain", "%s", st.Containment)
	}
	if st.Sandbox != "" {
		row("sandbox", "%s", st.Sandbox)
	}
	if st.Limits != "" {
		row("limits", "%s", st.Limits)
	}
	if st.Policy != "" {
		row("policy", "%s", st.Policy)
	}
	if st.Warm != "" {
		row("warm", "%s", st.Warm)
	}
	if st.LastError != "" {
		// A status file written by an older worker may hold an engine's
		// page that echoed the request URL; its token= is not shown.
		row("error", "%s", strings.TrimSpace(logging.NewRedactor("").Scrub(st.LastError)))
	}
	row("process", "pid %d, fluksio-worker %s, status written %s", st.PID, st.Version, ago(now, st.Updated))
}

// declinedText is ", 5 declined (policy 5)" for the calls answered without
// running, by reason, most first; "" for none.
func declinedText(by map[string]int64) string {
	var total int64
	reasons := make([]string, 0, len(by))
	for reason, n := range by {
		if n > 0 {
			total += n
			reasons = append(reasons, reason)
		}
	}
	if total == 0 {
		return ""
	}
	sort.Slice(reasons, func(i, j int) bool {
		if by[reasons[i]] != by[reasons[j]] {
			return by[reasons[i]] > by[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	parts := make([]string, len(reasons))
	for i, reason := range reasons {
		parts[i] = fmt.Sprintf("%s %d", strings.ReplaceAll(reason, "_", " "), by[reason])
	}
	return fmt.Sprintf(", %d declined (%s)", total, strings.Join(parts, ", "))
}

// writeWorkerState is the worker row of a worker that runs, or of one
// that stopped without saying why (killed outright): what it last said.
func writeWorkerState(row func(label, format string, args ...any), prefix string, now time.Time, st status.Status) {
	switch st.State {
	case status.StateAttached:
		since := ""
		if !st.Since.IsZero() {
			since = fmt.Sprintf(" since %s (%s)", st.Since.Local().Format("2006-01-02 15:04:05 MST"), ago(now, st.Since))
		}
		row("worker", "%sattached as %q%s", prefix, st.Name, since)
	case status.StateConnecting:
		if st.DownSince.IsZero() || st.Attempts == 0 {
			row("worker", "%sconnecting to the engine (not attached)", prefix)
			break
		}
		attempts := "1 attempt"
		if st.Attempts != 1 {
			attempts = fmt.Sprintf("%d attempts", st.Attempts)
		}
		row("worker", "%snot attached since %s (%s, %s), retrying", prefix,
			st.DownSince.Local().Format("2006-01-02 15:04:05 MST"), ago(now, st.DownSince), attempts)
	case status.StateReloading:
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
		attached := err == nil && st.State == status.StateAttached && !st.Since.Before(fresh)
		// A reload waiting for calls may wait for hours.
		waiting := err == nil && st.State == status.StateReloading && st.Reload != nil
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
	fmt.Fprint(w, `Usage: fluksio-worker status [--user-service] [--json]
       fluksio-worker status --state-dir DIR | --config FILE [--json]

Shows whether the worker service is running, and what the worker says it is
doing: which engine, attached under which name since when, how many calls it
is running and has done, and its last error. The token is never shown.

Without sudo it shows the service's state; the worker's own status is
readable by the service account and root.

Options:
`)
	config.WriteOption(w, "--user-service", userServiceHelp)
	config.WriteOption(w, "--state-dir DIR", "show the worker that keeps its state in DIR (its --state-dir), however it runs: in the foreground, a batch job or a pod")
	config.WriteOption(w, "--config FILE", "show the worker this config file describes (its state-dir, else the default)")
	config.WriteOption(w, "--json", "print the state and the worker's status file as one JSON object, for scripts")
	fmt.Fprint(w, `
Exit status, as systemctl's: 0 running, 3 stopped (or failed), 4 not
installed (or no worker ever ran with that state directory).
`)
}
