package installer

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// ReloadCommand is `fluksio-worker reload`: ask the installed worker to
// reload gracefully (see agent/reload.go): it declines new calls, lets the
// running ones finish, then re-executes the binary and config now on disk
// in the same process. systemd runs the unit's ExecReload (a SIGHUP);
// launchd has no reload verb, so there it is `launchctl kill SIGHUP`.
func ReloadCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	return control(thisHost(), "reload", args, stdout, stderr, writeReloadUsage, (*manager).Reload, "Asked a reload of")
}

var writeReloadUsage = writeControlUsage("reload", `Reloads the installed worker service without stopping its calls: new calls
are declined (the engine places them elsewhere), running ones finish (for at
most --reload-timeout, default: as long as they run), then the worker runs
the binary and config now on disk in the same process and attaches again.
It returns at once; 'fluksio-worker status' shows a reload that waits, and
for which calls. 'fluksio-worker restart' instead stops the calls.`)

// Reload asks the running service to reload. It returns once asked, not
// once reloaded: the worker may wait hours for its calls.
func (m *manager) Reload() error {
	var cmd *exec.Cmd
	switch {
	case m.layout.GOOS == "darwin":
		cmd = exec.Command("launchctl", "kill", "SIGHUP", launchdTarget(m.layout))
	case m.layout.UserService:
		cmd = exec.Command("systemctl", "--user", "reload", unitName+".service")
	default:
		cmd = exec.Command("systemctl", "reload", unitName+".service")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return m.explain("reloading the service", fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out))))
	}
	return nil
}

// reloadApplies says whether a running service whose unit was oldUnit can
// take newUnit's change by a reload. It cannot when the old unit has no
// ExecReload= (a worker from before reloads existed would die of the
// SIGHUP), or when the unit changed in what only a new process gets from
// systemd: the account, the command line, the sandbox. The stop timeout is
// read by systemd when it stops, so it needs no restart.
func reloadApplies(oldUnit, newUnit string) bool {
	if !strings.Contains(oldUnit, "\nExecReload=") {
		return false
	}
	return unitLines(oldUnit) == unitLines(newUnit)
}

// unitLines is a unit's directives without comments and the stop timeout.
func unitLines(unit string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "TimeoutStopSec=") {
			continue
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
