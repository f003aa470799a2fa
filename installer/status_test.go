package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
)

func TestStatusShowsTheWorkerWithoutItsToken(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	st := status.Status{
		PID: 4711, Version: "1.2.3", State: "attached", Name: "gpu-box",
		Engine:       "wss://e.example.com/api/v1/workers/attach?token=s3cret",
		Since:        time.Now().Add(-90 * time.Second),
		CallsRunning: 1, CallsDone: 12, LastError: "connection reset\n",
		Updated: time.Now().Add(-2 * time.Second), Containment: "subreaper+cookie",
		Warm: "1 spare runner kept ready (--warm 1)",
	}
	var out bytes.Buffer
	writeStatus(&out, l, Running, st, nil)
	text := out.String()
	for _, want := range []string{
		"fluksio-worker: running (systemd system service)",
		`attached as "gpu-box" since `, "(1m30s ago)",
		"1 running, 12 done", "connection reset", "contain:  subreaper+cookie", "warm:     1 spare runner kept ready (--warm 1)", "pid 4711, fluksio-worker 1.2.3",
		"journalctl -u fluksio-worker", "/etc/fluksio-worker/config.toml",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "s3cret") {
		t.Errorf("status shows the token:\n%s", text)
	}

	out.Reset()
	writeStatus(&out, l, Stopped, st, nil)
	if !strings.Contains(out.String(), "fluksio-worker: stopped") || !strings.Contains(out.String(), "last seen attached") {
		t.Errorf("a stopped worker's status reads as live:\n%s", out.String())
	}

	// Not attached: since when, and how many attempts failed.
	out.Reset()
	down := status.Status{PID: 4711, State: "connecting", DownSince: time.Now().Add(-5 * time.Minute), Attempts: 7, LastError: "dial tcp: connection refused"}
	writeStatus(&out, l, Running, down, nil)
	if !strings.Contains(out.String(), "worker:   not attached since ") || !strings.Contains(out.String(), "(5m0s ago, 7 attempts), retrying") {
		t.Errorf("a worker that cannot attach does not say since when and how many attempts:\n%s", out.String())
	}

	out.Reset()
	writeStatus(&out, l, Running, status.Status{}, &fs.PathError{Op: "open", Path: "/var/lib/fluksio-worker/status.json", Err: fs.ErrPermission})
	if !strings.Contains(out.String(), "sudo fluksio-worker status") {
		t.Errorf("without permission, status should say to use sudo:\n%s", out.String())
	}
}

func TestStatusOfNothingInstalledExits4(t *testing.T) {
	h := testHost(t, 1000)
	var out bytes.Buffer
	// The system unit path is real; skip where this machine has the worker.
	if exists("/etc/systemd/system/fluksio-worker.service") {
		t.Skip("the worker is installed on this machine")
	}
	if code := showStatus(context.Background(), h, nil, &out, io.Discard); code != config.ExitNotInstalled {
		t.Errorf("exit %d, want 4:\n%s", code, out.String())
	}
	// A command that installs, not a pointer to more help.
	if !strings.Contains(out.String(), "not installed") || !strings.Contains(out.String(), "fluksio-worker install --user-service --url wss://ENGINE/api/v1/workers/attach --token -") && !strings.Contains(out.String(), "sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token -") {
		t.Errorf("%s", out.String())
	}
}

// status --state-dir and --config show a worker that is not a service: a
// foreground, batch or Kubernetes worker, from the status file it keeps.
func TestStatusOfAnyWorker(t *testing.T) {
	h := testHost(t, 1000)
	dir := t.TempDir()
	run := func(args ...string) (int, string) {
		t.Helper()
		var out, errs bytes.Buffer
		code := showStatus(context.Background(), h, args, &out, &errs)
		return code, out.String() + errs.String()
	}
	if code, out := run("--state-dir", dir); code != config.ExitNotInstalled || !strings.Contains(out, "no worker has run with this state directory") {
		t.Errorf("no status file: exit %d\n%s", code, out)
	}
	// This process stands for the worker: it is alive.
	f := status.NewFile(dir, status.Status{PID: os.Getpid(), Version: "1.2.3", State: "attached", Name: "batch-1",
		Engine: "wss://e.example.com/api/v1/workers/attach", CallsDone: 3, Since: time.Now()}, logging.NewRedactor(""), nil)
	f.Flush()
	if code, out := run("--state-dir", dir); code != config.ExitOK || !strings.Contains(out, `attached as "batch-1"`) || !strings.Contains(out, "0 running, 3 done") {
		t.Errorf("a live worker: exit %d\n%s", code, out)
	}
	conf := filepath.Join(t.TempDir(), "worker.toml")
	os.WriteFile(conf, []byte("url = \"wss://e.example.com\"\nstate-dir = \""+dir+"\"\n"), 0o600)
	code, out := run("--config", conf, "--json")
	var report struct {
		State    string         `json:"state"`
		StateDir string         `json:"state_dir"`
		Worker   *status.Status `json:"worker"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != config.ExitOK || report.State != "running" ||
		report.StateDir != dir || report.Worker == nil || report.Worker.CallsDone != 3 || report.Worker.Name != "batch-1" {
		t.Errorf("status --config --json: exit %d, %+v (%v)\n%s", code, report, err, out)
	}
	f.Update(func(s *status.Status) { s.State = "stopped" })
	f.Flush()
	if code, out := run("--state-dir", dir); code != config.ExitStopped || !strings.Contains(out, "fluksio-worker: stopped") {
		t.Errorf("a stopped worker: exit %d\n%s", code, out)
	}
}

func TestUnitAccount(t *testing.T) {
	unit, _ := renderUnit(systemParams, false)
	if got := unitAccount(unit); got != "fluksio-worker" {
		t.Errorf("unit: %q", got)
	}
	plist, _ := renderPlist(serviceParams{Executable: "/x", ConfigPath: "/c", Account: "a&b"}, "/logs")
	if got := unitAccount(plist); got != "a&b" {
		t.Errorf("plist: %q", got)
	}
	user, _ := renderUnit(serviceParams{Executable: "/x", ConfigPath: "/c"}, true)
	if got := unitAccount(user); got != "" {
		t.Errorf("user unit: %q", got)
	}
}

func TestPurgeLeavesAHandPickedStateDir(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	if got := purgeDirs(l, l.StateDir); strings.Join(got, " ") != "/etc/fluksio-worker /var/lib/fluksio-worker" {
		t.Errorf("default: %v", got)
	}
	if got := purgeDirs(l, "/home/ada"); strings.Join(got, " ") != "/etc/fluksio-worker" {
		t.Errorf("a state-dir set by hand would be removed: %v", got)
	}
	mac, _ := layoutFor("darwin", false, dirs{})
	if got := purgeDirs(mac, mac.StateDir); len(got) != 3 {
		t.Errorf("macOS: %v", got)
	}
}

// TestEveryCommandExplainsItself runs each command's --help: it must exit
// 0 and tell someone who has never heard of Fluksio what the command does.
func TestEveryCommandExplainsItself(t *testing.T) {
	for name, cmd := range map[string]func(context.Context, []string, io.Writer, io.Writer) int{
		"install": InstallCommand, "uninstall": UninstallCommand, "start": StartCommand,
		"stop": StopCommand, "restart": RestartCommand, "status": StatusCommand, "check": CheckCommand,
	} {
		var out, errOut bytes.Buffer
		if code := cmd(context.Background(), []string{"--help"}, &out, &errOut); code != 0 {
			t.Errorf("%s --help: exit %d, stderr %q", name, code, errOut.String())
		}
		text := out.String()
		if !strings.HasPrefix(text, "Usage: ") || !strings.Contains(text, "fluksio-worker "+name) {
			t.Errorf("%s --help does not start with its usage:\n%s", name, text)
		}
		for i, line := range strings.Split(text, "\n") {
			if len(line) > config.HelpWidth {
				t.Errorf("%s --help line %d is %d columns wide: %q", name, i+1, len(line), line)
			}
		}
		var code int
		errOut.Reset()
		if code = cmd(context.Background(), []string{"--no-such-flag"}, io.Discard, &errOut); code != config.ExitUsage {
			t.Errorf("%s --no-such-flag: exit %d, want 2", name, code)
		}
		if !strings.Contains(errOut.String(), "--help") {
			t.Errorf("%s: a bad flag should point at --help: %q", name, errOut.String())
		}
	}
}
