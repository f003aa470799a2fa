package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// serviceToken is the token of the service test. It must show up in exactly
// one file of the machine: the config.
const serviceToken = "svc-e2e-token-9d41c7"

// TestServiceUnderSystemd is `install` as a user lives it, on a Debian with
// a real systemd booted under systemd-nspawn: the binary copied in, the
// token pasted on stdin, the fake engine on the host's loopback (the
// container shares it). It checks the service attaches with the right
// hello, runs a node, survives restart and a crash, reports itself through
// `status`, keeps its token in one 0600 file owned by the service account
// and out of argv, the unit and the journal, takes a second install as an
// update, refuses a bad token without breaking what runs, and leaves
// nothing after `uninstall --purge`.
//
// It needs root, debootstrap and systemd-nspawn; without them it is skipped,
// except under CI (env CI set), where it fails.
func TestServiceUnderSystemd(t *testing.T) {
	nspawn.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	started := time.Now()
	step := stepTimer(t)

	bin := buildStaticWorker(t)
	step("build a static binary")
	m := bootMachine(ctx, t)
	step("boot")

	eng := startEngine(t, enginetest.Options{Tokens: []string{serviceToken}})
	// sh runs a script in the container and returns its output and exit code.
	sh := func(script string) (string, int) {
		t.Helper()
		out, err := m.Exec(ctx, script)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return out, exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return out, 0
	}
	must := func(script string) string {
		t.Helper()
		out, code := sh(script)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s", script, code, out)
		}
		return out
	}
	// The binary goes where the service account can run it: not /tmp,
	// which the unit's PrivateTmp hides.
	if err := m.CopyIn(bin, "/usr/local/bin/fluksio-worker"); err != nil {
		t.Fatal(err)
	}
	// The engine's web address, as a person would paste it.
	engineURL := "http://" + eng.Addr()
	install := fmt.Sprintf("printf '%%s\\n' %s | fluksio-worker install --url %s --token - --labels e2e,gpu --name e2e-box", serviceToken, engineURL)

	addGPUGroups(ctx, t, m)

	// Without root it says what to do, and changes nothing.
	out, code := sh(strings.Replace(install, "| fluksio-worker", "| runuser -u nobody -- fluksio-worker", 1))
	if code != 1 || !strings.Contains(out, "run it with sudo") {
		t.Errorf("install without root: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(m.Path("/etc/fluksio-worker")); err == nil {
		t.Error("install without root created /etc/fluksio-worker")
	}

	// What a user can fix is checked before anything is made: a binary
	// under /tmp, a token the engine refuses. Neither leaves the account.
	must("cp /usr/local/bin/fluksio-worker /tmp/fluksio-worker")
	out, code = sh(strings.Replace(install, "| fluksio-worker", "| /tmp/fluksio-worker", 1))
	if code != 1 || !strings.Contains(out, "cannot see /tmp") {
		t.Errorf("install from /tmp: exit %d\n%s", code, out)
	}
	out, code = sh(strings.Replace(install, serviceToken, "not-the-token", 1))
	if code != 1 || !strings.Contains(out, "refused") || !strings.Contains(out, "nothing was installed") {
		t.Errorf("install with a refused token: exit %d\n%s", code, out)
	}
	// A URL that can never work (wss:// to this engine, which has no TLS)
	// is refused too, with the URL to use: the service would exit 2.
	out, code = sh(strings.Replace(install, engineURL, "https://"+eng.Addr(), 1))
	if code != 2 || !strings.Contains(out, "use ws://"+eng.Addr()+"/api/v1/workers/attach") || !strings.Contains(out, "nothing was installed") {
		t.Errorf("install with wss:// to an engine without TLS: exit %d\n%s", code, out)
	}
	if out, code := sh("getent passwd fluksio-worker"); code == 0 {
		t.Errorf("a failed install created the account: %s", out)
	}

	// Install: the account is created, the service enabled, started, and
	// the install waits to report it attached.
	out = must(install)
	t.Logf("install said:\n%s", out)
	if !strings.Contains(out, `attached as "e2e-box"`) || !strings.Contains(out, "accepts this worker") {
		t.Errorf("install did not report the engine check and the attached worker:\n%s", out)
	}
	if !strings.Contains(out, "Added fluksio-worker to the groups video and render") {
		t.Errorf("install did not say which GPU groups it added the account to:\n%s", out)
	}
	if state := strings.TrimSpace(must("systemctl is-active fluksio-worker; systemctl is-enabled fluksio-worker")); state != "active\nenabled" {
		t.Fatalf("after install the service is %q", state)
	}
	w := liveWorker(ctx, t, eng)
	if !slices.Equal(w.Hello.Labels, []string{"e2e", "gpu"}) || w.Hello.Name != "e2e-box" || !filepath.IsAbs(w.Hello.Python) {
		t.Errorf("hello: labels %v, name %q, python %q; want [e2e gpu], e2e-box and an absolute path", w.Hello.Labels, w.Hello.Name, w.Hello.Python)
	}
	runDouble(ctx, t, w, "c1", 21)
	step("install, attach, run a node")

	// The config: 0600, the service account's, in a directory it may only read.
	if got := strings.TrimSpace(must("stat -c '%a %U:%G' /etc/fluksio-worker/config.toml /etc/fluksio-worker")); got != "600 fluksio-worker:fluksio-worker\n750 root:fluksio-worker" {
		t.Errorf("config and its directory: %q; want 600 fluksio-worker:fluksio-worker and 750 root:fluksio-worker", got)
	}
	config := must("cat /etc/fluksio-worker/config.toml")
	for _, want := range []string{`url = "ws://` + eng.Addr() + `/api/v1/workers/attach"`, `token = "` + serviceToken + `"`, `state-dir = "/var/lib/fluksio-worker"`} {
		if !strings.Contains(config, want) {
			t.Errorf("the config lacks %s:\n%s", want, config)
		}
	}
	checkGPUGroups(ctx, t, m, "fluksio-worker")

	// What systemd made of the unit: the GPUs stay reachable (no device
	// ACL), a refusal is not restarted, stopping leaves calls to the agent.
	props := must("systemctl show fluksio-worker -p User -p KillMode -p DevicePolicy -p RestartPreventExitStatus -p ProtectHome -p NoNewPrivileges")
	for _, want := range []string{"User=fluksio-worker", "KillMode=mixed", "DevicePolicy=auto", "RestartPreventExitStatus=1 2", "ProtectHome=read-only", "NoNewPrivileges=yes"} {
		if !strings.Contains(props, want) {
			t.Errorf("systemctl show lacks %q:\n%s", want, props)
		}
	}
	if acl := strings.TrimSpace(must("systemctl show fluksio-worker -p DeviceAllow --value")); acl != "" {
		t.Errorf("the unit has a device ACL (%s): GPUs would be unreachable", acl)
	}
	security, _ := sh("systemd-analyze security --no-pager fluksio-worker")
	if match := regexp.MustCompile(`Overall exposure level for fluksio-worker.service: ([0-9.]+) \S+`).FindStringSubmatch(security); match == nil {
		t.Errorf("systemd-analyze security gave no rating:\n%s", security)
	} else if exposure, _ := strconv.ParseFloat(match[1], 64); exposure > maxServiceExposure {
		t.Errorf("systemd-analyze security rates the installed unit %s, worse than the README's %.1f", match[0], maxServiceExposure)
	} else {
		t.Logf("systemd-analyze security, in the container: %s", match[0])
	}

	// status: what the worker says about itself, live.
	eventuallyIn(t, 15*time.Second, "status to show the finished call", func() (bool, string) {
		out, code := sh("fluksio-worker status")
		return code == 0 && strings.Contains(out, `attached as "e2e-box"`) && strings.Contains(out, "0 running, 1 done"), out
	})
	out, code = sh("runuser -u nobody -- fluksio-worker status")
	if code != 0 || !strings.Contains(out, "fluksio-worker: running") || strings.Contains(out, serviceToken) {
		t.Errorf("status without root: exit %d\n%s", code, out)
	}
	out = must("fluksio-worker check")
	if !strings.Contains(out, "token      accepted") || !strings.Contains(out, "account    fluksio-worker") {
		t.Errorf("check:\n%s", out)
	}
	// The same, for scripts and fleet tools; and the worker found by its
	// state directory, as a worker not run as a service would be.
	var report struct {
		State  string `json:"state"`
		Worker struct {
			State     string `json:"state"`
			CallsDone int    `json:"calls_done"`
		} `json:"worker"`
	}
	if out := must("fluksio-worker status --json"); json.Unmarshal([]byte(out), &report) != nil || report.State != "running" || report.Worker.State != "attached" || report.Worker.CallsDone != 1 {
		t.Errorf("status --json: %+v\n%s", report, out)
	}
	if out := must("fluksio-worker status --state-dir /var/lib/fluksio-worker"); !strings.Contains(out, "fluksio-worker: running") || !strings.Contains(out, `attached as "e2e-box"`) {
		t.Errorf("status --state-dir:\n%s", out)
	}
	var checked struct {
		OK    bool `json:"ok"`
		Items []struct {
			Item, Result string
		} `json:"items"`
	}
	if out := must("fluksio-worker check --json"); json.Unmarshal([]byte(out), &checked) != nil || !checked.OK || len(checked.Items) < 7 {
		t.Errorf("check --json: %+v\n%s", checked, out)
	}
	step("config, unit, status, check")
	checkServiceContainment(ctx, t, w, must)
	step("a node's helpers are gone after its call, its cgroup empty")

	// restart: the old connection closes, a new one attaches and works.
	pid := mainPID(t, must)
	must("fluksio-worker restart")
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	runDouble(ctx, t, w, "c2", 50)
	if mainPID(t, must) == pid {
		t.Error("restart kept the same process")
	}
	step("restart, reattach")

	// A crash: systemd restarts it (RestartSec=5) and it attaches again.
	must("kill -KILL " + mainPID(t, must))
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	runDouble(ctx, t, w, "c3", 7)
	step("kill -9, restarted by systemd, reattach")

	// An engine outage as the journal and status tell it: the lost
	// connection, then one counted line per failed attempt; back, the
	// attached line says how long it was away.
	addr := eng.Addr()
	eng.Close()
	serviceGone(t, w)
	eventuallyIn(t, 30*time.Second, "the journal and status to count a failed attempt", func() (bool, string) {
		journal := must("journalctl --no-pager -o cat -u fluksio-worker -p warning")
		st := must("fluksio-worker status")
		return strings.Contains(journal, `msg="connection lost; reconnecting"`) &&
			strings.Contains(journal, `msg="cannot reach the engine; retrying" attempt=1 down_for=`) &&
			strings.Contains(st, "not attached since "), journal + st
	})
	eng = startEngine(t, enginetest.Options{Tokens: []string{serviceToken}, Addr: addr})
	w = liveWorker(ctx, t, eng)
	eventuallyIn(t, 15*time.Second, "the attached line to say how long the worker was away", func() (bool, string) {
		journal := must("journalctl --no-pager -o cat -u fluksio-worker")
		return regexp.MustCompile(`msg=attached .* away=\S+ failed_attempts=\d+`).MatchString(journal), journal
	})
	step("an engine outage: counted retries, away= when back")

	// install again: an update. The options given change, the others
	// (URL, token, name) stay; the service restarts with them.
	out = must("fluksio-worker install --labels e2e,second </dev/null")
	if strings.Contains(strings.ToLower(out), "already exists") {
		t.Errorf("a second install:\n%s", out)
	}
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	if !slices.Equal(w.Hello.Labels, []string{"e2e", "second"}) || w.Hello.Name != "e2e-box" {
		t.Errorf("after the second install: labels %v, name %q", w.Hello.Labels, w.Hello.Name)
	}
	if got := strings.TrimSpace(must("stat -c '%a %U' /etc/fluksio-worker/config.toml")); got != "600 fluksio-worker" {
		t.Errorf("after the second install the config is %q", got)
	}
	if out := must("fluksio-worker install --refresh-unit"); !strings.Contains(out, "up to date") {
		t.Errorf("--refresh-unit right after install: %s", out)
	}
	// A reload bounded by --reload-timeout. Setting it reloads the worker,
	// at once as nothing runs; then a node longer than the bound is stopped
	// when it runs out, reported, and the same process attaches again.
	pid = mainPID(t, must)
	reloadLines := func() (int, int, string) {
		got := must("journalctl --no-pager -o cat -u fluksio-worker")
		return strings.Count(got, "reloading: nothing is running"), strings.Count(got, "reloading once the running calls finish"), got
	}
	idle, waited, _ := reloadLines()
	out = must("fluksio-worker install --reload-timeout 2s --check=false </dev/null")
	if !strings.Contains(out, "Reloading the running worker") || !strings.Contains(out, "attached as") {
		t.Errorf("install --reload-timeout:\n%s", out)
	}
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	eventuallyIn(t, 15*time.Second, "the journal to say the reload waited for no call", func() (bool, string) {
		nowIdle, nowWaited, journal := reloadLines()
		return nowIdle == idle+1 && nowWaited == waited, journal
	})
	long := startLongNode(ctx, t, w, "long", 120)
	start := time.Now()
	must("fluksio-worker reload")
	answer, _, err := long.WaitTimeout(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Stopped as a stop stops it: the runtime answers for itself on SIGTERM.
	// Not before the bound; and long before the node's own 120 s.
	if took := time.Since(start); took < 2*time.Second || took > 60*time.Second || !strings.Contains(string(answer.Raw), `"NodeCancelled"`) {
		t.Errorf("a node over --reload-timeout 2s answered after %v: %s", took, answer.Raw)
	}
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	if got := mainPID(t, must); got != pid {
		t.Errorf("the reloads restarted the service (MainPID %s, was %s)", got, pid)
	}
	runDouble(ctx, t, w, "c4", 3)
	step("--reload-timeout: immediate when idle, stops a longer node")

	// --no-start writes the change but leaves the running worker alone;
	// the next start (below) picks it up.
	if out := must("fluksio-worker install --no-start --parallel 2 --check=false"); !strings.Contains(out, "Not restarted") {
		t.Errorf("install --no-start:\n%s", out)
	}
	// The same connection still serves calls: install --no-start
	// restarted nothing (a restart finishes before install returns).
	runDouble(ctx, t, w, "c4", 8)
	step("install again (update), --refresh-unit, --no-start")

	// A token the engine refuses fails the install with the engine's
	// reason, before anything is written: the running worker is untouched.
	out, code = sh("printf 'not-the-token\\n' | fluksio-worker install --token -")
	if code != 1 || !strings.Contains(out, "refused") {
		t.Errorf("install with a refused token: exit %d\n%s", code, out)
	}
	if after := must("cat /etc/fluksio-worker/config.toml"); !strings.Contains(after, serviceToken) {
		t.Errorf("a refused install changed the config:\n%s", after)
	}
	runDouble(ctx, t, w, "c5", 9) // the running worker is undisturbed
	step("install with a refused token")

	checkJournal(ctx, t, w, must)
	step("the journal's priorities")
	// A bad configuration exits 2, which systemd does not restart: the
	// unit is failed, the reason in its journal, until it is fixed.
	must("cp -p /etc/fluksio-worker/config.toml /root/config.good && echo 'bogus-key = 1' >> /etc/fluksio-worker/config.toml")
	sh("systemctl restart fluksio-worker")
	serviceGone(t, w)
	time.Sleep(7 * time.Second) // RestartSec=5 and a moment: a restart would have happened
	if got := must("systemctl show fluksio-worker -p ActiveState -p ExecMainStatus -p NRestarts"); !strings.Contains(got, "ActiveState=failed") || !strings.Contains(got, "ExecMainStatus=2") || !strings.Contains(got, "NRestarts=0") {
		t.Errorf("after a bad configuration: %s; want failed with exit 2, not restarted", got)
	}
	if got := must("journalctl --no-pager -o cat -u fluksio-worker -p err -n 5"); !strings.Contains(got, `unknown key "bogus-key"`) {
		t.Errorf("journalctl -p err does not say what is wrong with the configuration:\n%s", got)
	}
	must("mv -f /root/config.good /etc/fluksio-worker/config.toml && systemctl restart fluksio-worker")
	w = liveWorker(ctx, t, eng)
	step("a bad configuration is not restarted")

	// The token is in the config and nowhere else: not in any process's
	// argv, the unit, the journal, or any other file.
	argv := must("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
	if strings.Contains(argv, serviceToken) {
		t.Error("the token is in a process's argv")
	}
	if !strings.Contains(argv, "fluksio-worker run --config /etc/fluksio-worker/config.toml") {
		t.Errorf("the service's command line is not the expected one:\n%s", argv)
	}
	journal := must("journalctl --no-pager -u fluksio-worker")
	if strings.Contains(journal, serviceToken) {
		t.Errorf("the journal holds the token:\n%s", journal)
	}
	files := strings.Fields(must("grep -rlsF -D skip " + serviceToken + " /etc /var /run /root /home /tmp /usr/local /opt /srv || true"))
	if !slices.Equal(files, []string{"/etc/fluksio-worker/config.toml"}) {
		t.Errorf("the token is in %v; want only /etc/fluksio-worker/config.toml", files)
	}
	step("the token is in one file only")

	// stop and start, with status's exit codes.
	must("fluksio-worker stop")
	serviceGone(t, w)
	if out, code := sh("fluksio-worker status"); code != 3 || !strings.Contains(out, "fluksio-worker: stopped") {
		t.Errorf("status of a stopped service: exit %d\n%s", code, out)
	}
	must("fluksio-worker start")
	w = liveWorker(ctx, t, eng)
	if w.Hello.MaxParallel != 2 {
		t.Errorf("after a start the worker offers %d at a time; install --no-start wrote 2", w.Hello.MaxParallel)
	}
	// Spares stopped with the service are no node's leftovers: no warning.
	if warned := must("journalctl --no-pager -o cat -u fluksio-worker -p warning | grep spare_of= || true"); strings.TrimSpace(warned) != "" {
		t.Errorf("stopping the service warned about its spare runners:\n%s", warned)
	}
	step("stop, start")

	// install --user alice: the service runs as a person's account, whose
	// home stays writable (ProtectHome=read-only spares it): node code
	// keeps its caches there.
	must("useradd --create-home --shell /bin/sh alice")
	must("fluksio-worker install --user alice --check=false </dev/null")
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	if user := strings.TrimSpace(must("systemctl show -p User --value fluksio-worker")); user != "alice" {
		t.Errorf("after install --user alice the service runs as %q", user)
	}
	answer, err = runSource(ctx, w, "home", "import os\ndef f():\n    p = os.path.expanduser('~/.cache/node/weights')\n    os.makedirs(os.path.dirname(p), exist_ok=True)\n    with open(p, 'w') as fh:\n        fh.write('kept')\n    return {'path': p}\n")
	if err != nil || !answer.OK || !strings.Contains(string(answer.Raw), `"/home/alice/.cache/node/weights"`) {
		t.Errorf("a node writing its cache in alice's home answered %s (%v)", answer.Raw, err)
	}
	if got := strings.TrimSpace(must("stat -c '%U' /home/alice/.cache/node/weights && cat /home/alice/.cache/node/weights")); got != "alice\nkept" {
		t.Errorf("the node's file in alice's home: %q", got)
	}
	step("install --user alice, her home writable")

	// uninstall --purge: stopped, disabled, and nothing left.
	out = must("fluksio-worker uninstall --purge")
	serviceGone(t, w)
	for _, gone := range []string{"/etc/systemd/system/fluksio-worker.service", "/etc/fluksio-worker", "/var/lib/fluksio-worker", "/etc/systemd/system/multi-user.target.wants/fluksio-worker.service"} {
		if _, err := os.Lstat(m.Path(gone)); err == nil {
			t.Errorf("uninstall --purge left %s\n%s", gone, out)
		}
	}
	if out := must("systemctl list-unit-files fluksio-worker.service --no-legend || true"); strings.TrimSpace(out) != "" {
		t.Errorf("systemd still knows the unit: %s", out)
	}
	if out, code := sh("fluksio-worker status"); code != 4 {
		t.Errorf("status after uninstall: exit %d, want 4\n%s", code, out)
	}
	if files := strings.TrimSpace(must("grep -rlsF -D skip " + serviceToken + " /etc /var /run /root || true")); files != "" {
		t.Errorf("the token survived the purge in %s", files)
	}
	must("fluksio-worker uninstall") // nothing installed: still fine
	step("uninstall --purge")
	t.Logf("the whole service test took %v", time.Since(started).Round(time.Second))
}

// runSource runs the function f of a node's source as call id and waits
// up to a minute for its answer.
func runSource(ctx context.Context, w *enginetest.Worker, id, source string) (enginetest.Message, error) {
	c, err := w.Run(map[string]any{
		"op": "run", "call_id": id,
		"node":     map[string]any{"source": source, "filename": "f.py"},
		"function": "f", "inputs": map[string]any{}, "settings": map[string]any{},
	})
	if err != nil {
		return enginetest.Message{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	answer, _, err := c.Wait(ctx)
	return answer, err
}

// checkJournal runs a node that raises and reads the journal back as an
// operator would: `-p warning` shows the failed call and not the ordinary
// lines, and no line repeats the timestamp journald records itself.
func checkJournal(ctx context.Context, t *testing.T, w *enginetest.Worker, must func(string) string) {
	t.Helper()
	if answer, err := runSource(ctx, w, "journal-fail", "def f():\n    raise ValueError('journal test')\n"); err != nil || answer.OK {
		t.Fatalf("the failing node answered %s (%v)", answer.Raw, err)
	}
	var warnings string
	eventuallyIn(t, 15*time.Second, "journalctl -p warning to show the failed call", func() (bool, string) {
		warnings = must("journalctl --no-pager -o cat -u fluksio-worker -p warning")
		return strings.Contains(warnings, "call_id=journal-fail") && strings.Contains(warnings, "outcome=error"), warnings
	})
	if strings.Contains(warnings, "msg=attached") || strings.Contains(warnings, "level=INFO") {
		t.Errorf("journalctl -p warning shows info lines:\n%s", warnings)
	}
	all := must("journalctl --no-pager -o cat -u fluksio-worker -p debug")
	if !strings.Contains(all, "msg=attached") {
		t.Errorf("the journal lacks the info line attached:\n%s", all)
	}
	if regexp.MustCompile(`(?m)(^|\s)time=`).MatchString(all) {
		t.Errorf("the journal's lines carry their own timestamp:\n%s", all)
	}
}

// maxServiceExposure is the rating the README gives the installed unit
// (systemd-analyze security, systemd 252): 2.3 before Delegate=yes, which
// a cgroup per call needs, cost 0.2, and 2.5 before the calls' sandbox,
// which costs 0.6 (see installer's maxExposure).
const maxServiceExposure = 3.1

// buildStaticWorker builds the binary the way releases are built (no cgo),
// so it runs in the container whatever the host's libc.
func buildStaticWorker(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "fluksio-worker")
	cmd := exec.Command("go", "build", "-o", out, "github.com/fluksio/fluksio-worker")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	return out
}

// serviceGone waits for a worker's connection to close.
func serviceGone(t *testing.T, w *enginetest.Worker) {
	t.Helper()
	select {
	case <-w.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("the worker's connection is still open")
	}
}

// eventuallyIn polls cond until it holds, failing with its last output.
func eventuallyIn(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("waited %v for %s; last:\n%s", timeout, what, last)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestUserServiceUnderSystemd is `install --user-service`: no root, a
// systemd --user unit, the config in the user's home. The user lingers, so
// their systemd instance runs without a login session, as on a server.
func TestUserServiceUnderSystemd(t *testing.T) {
	nspawn.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := buildStaticWorker(t)
	m, err := nspawn.Boot(ctx, nspawn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng := startEngine(t, enginetest.Options{Tokens: []string{serviceToken}})
	must := machineShell(ctx, t, m)
	if err := m.CopyIn(bin, "/usr/local/bin/fluksio-worker"); err != nil {
		t.Fatal(err)
	}
	// The test image has no pam_systemd, which is what normally gives
	// user@.service its $XDG_RUNTIME_DIR; a drop-in stands in for it.
	must("mkdir -p /etc/systemd/system/user@.service.d && printf '[Service]\\nEnvironment=XDG_RUNTIME_DIR=/run/user/%%i\\n' > /etc/systemd/system/user@.service.d/runtime-dir.conf && systemctl daemon-reload")
	must("useradd --create-home --shell /bin/sh ada && loginctl enable-linger ada")
	uid := strings.TrimSpace(must("id -u ada"))
	eventuallyIn(t, 30*time.Second, "ada's systemd instance", func() (bool, string) {
		_, err := m.Exec(ctx, "test -S /run/user/"+uid+"/systemd/private")
		return err == nil, ""
	})
	// as runs a script as ada, with what a login would give her.
	as := func(script string) string {
		t.Helper()
		return must("runuser -u ada -- env HOME=/home/ada XDG_RUNTIME_DIR=/run/user/" + uid + " sh -c '" + script + "'")
	}
	defer func() {
		if t.Failed() {
			out, _ := m.Exec(context.Background(), "runuser -u ada -- env XDG_RUNTIME_DIR=/run/user/"+uid+" systemctl --user status --no-pager fluksio-worker; journalctl --no-pager -n 60")
			t.Logf("the user service at the end:\n%s", out)
		}
	}()

	out := as(fmt.Sprintf("printf %%s\\\\n %s | fluksio-worker install --user-service --url %s --token - --labels user", serviceToken, eng.AttachURL()))
	if !strings.Contains(out, "systemd user service") || !strings.Contains(out, "attached as") {
		t.Errorf("install --user-service:\n%s", out)
	}
	w := liveWorker(ctx, t, eng)
	if !slices.Equal(w.Hello.Labels, []string{"user"}) {
		t.Errorf("hello labels %v", w.Hello.Labels)
	}
	runDouble(ctx, t, w, "u1", 4)
	if got := strings.TrimSpace(must("stat -c '%a %U' /home/ada/.config/fluksio-worker/config.toml /home/ada/.config/fluksio-worker")); got != "600 ada\n700 ada" {
		t.Errorf("the user's config and its directory: %q; want 600 and 700, ada's", got)
	}
	if state := strings.TrimSpace(as("systemctl --user is-active fluksio-worker; systemctl --user is-enabled fluksio-worker")); state != "active\nenabled" {
		t.Errorf("the user unit is %q", state)
	}
	// status and restart find the user service without being told.
	if out := as("fluksio-worker status"); !strings.Contains(out, "running (systemd user service)") || !strings.Contains(out, "attached as") {
		t.Errorf("status as ada:\n%s", out)
	}
	as("fluksio-worker restart")
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)

	as("fluksio-worker uninstall --purge")
	serviceGone(t, w)
	for _, gone := range []string{"/home/ada/.config/fluksio-worker", "/home/ada/.local/state/fluksio-worker", "/home/ada/.config/systemd/user/fluksio-worker.service"} {
		if _, err := os.Lstat(m.Path(gone)); err == nil {
			t.Errorf("uninstall --purge left %s", gone)
		}
	}
}
