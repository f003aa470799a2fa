package test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// TestServiceNotifyAndWatchdog is the installed service as systemd sees it,
// on a Debian booted under systemd-nspawn: Type=notify and active; a
// StatusText that names the attached worker, the engine and the calls; the
// watchdog set, fed through several periods without a restart; a worker
// whose loop is stopped (SIGSTOP) restarted by the watchdog; a restart while
// the engine is down still becomes active, and says why it is not attached;
// /metrics served on the --listen that install wrote, shown by status.
//
// It needs root, debootstrap and systemd-nspawn; without them it is skipped,
// except under CI (env CI set), where it fails.
func TestServiceNotifyAndWatchdog(t *testing.T) {
	nspawn.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	step := stepTimer(t)
	bin := buildStaticWorker(t)
	m := bootMachine(ctx, t)
	step("build, boot")
	eng := startEngine(t, enginetest.Options{Tokens: []string{serviceToken}})
	must := machineShell(ctx, t, m)
	if err := m.CopyIn(bin, "/usr/local/bin/fluksio-worker"); err != nil {
		t.Fatal(err)
	}
	// The container shares the host's loopback: a free port of the host's.
	listen := freeLoopbackAddr(t)
	must(fmt.Sprintf("printf '%%s\\n' %s | fluksio-worker install --url %s --token - --name mon-box --listen %s",
		serviceToken, eng.AttachURL(), listen))
	w := liveWorker(ctx, t, eng)
	runDouble(ctx, t, w, "s1", 3)
	show := func(props ...string) map[string]string {
		t.Helper()
		out := must("systemctl show fluksio-worker -p " + strings.Join(props, " -p "))
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(line, "=")
			got[k] = v
		}
		return got
	}

	// Type=notify, active, with the watchdog of the unit install wrote.
	got := show("Type", "NotifyAccess", "ActiveState", "WatchdogUSec", "NRestarts")
	for k, want := range map[string]string{"Type": "notify", "NotifyAccess": "main", "ActiveState": "active", "WatchdogUSec": "30s", "NRestarts": "0"} {
		if got[k] != want {
			t.Errorf("systemctl show: %s=%s, want %s", k, got[k], want)
		}
	}
	status := `attached as "mon-box" to ` + eng.AttachURL() + "; calls: 0 running, 1 done"
	eventuallyIn(t, 10*time.Second, "StatusText to name the worker, the engine and the call", func() (bool, string) {
		text := show("StatusText")["StatusText"]
		return text == status, text
	})
	if out := must("systemctl status --no-pager fluksio-worker || true"); !strings.Contains(out, "Status: \""+status) {
		t.Errorf("systemctl status does not show the worker's status line:\n%s", out)
	}
	// /metrics on the --listen install wrote, and status says where.
	resp, err := http.Get("http://" + listen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics of the service: HTTP %d", resp.StatusCode)
	}
	if out := must("fluksio-worker status"); !strings.Contains(out, "http://"+listen+"/metrics") {
		t.Errorf("status does not show the listen address:\n%s", out)
	}
	step("install: notify, status text, metrics")

	// A tighter watchdog, so several periods pass quickly: the worker pings
	// through them, and nothing restarts it.
	must("mkdir -p /etc/systemd/system/fluksio-worker.service.d && printf '[Service]\\nWatchdogSec=2\\n' > /etc/systemd/system/fluksio-worker.service.d/watchdog.conf && systemctl daemon-reload && systemctl restart fluksio-worker")
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	pid := mainPID(t, must)
	time.Sleep(9 * time.Second)
	got = show("ActiveState", "WatchdogUSec", "NRestarts", "MainPID")
	if got["ActiveState"] != "active" || got["WatchdogUSec"] != "2s" || got["NRestarts"] != "0" || got["MainPID"] != pid {
		t.Errorf("after four watchdog periods of 2 s: %v; want active, 2s, no restart, main pid %s", got, pid)
	}
	step("four watchdog periods without a restart")

	// A stopped worker stops pinging: the watchdog restarts it, and the
	// new one attaches.
	must("kill -STOP " + pid)
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	got = show("ActiveState", "NRestarts", "MainPID")
	if got["ActiveState"] != "active" || got["NRestarts"] != "1" || got["MainPID"] == pid {
		t.Errorf("after SIGSTOP: %v; want active, one restart, a new main pid", got)
	}
	if journal := must("journalctl --no-pager -u fluksio-worker"); !strings.Contains(journal, "Watchdog timeout") {
		t.Errorf("the journal does not say the watchdog fired:\n%s", journal)
	}
	runDouble(ctx, t, w, "s2", 5)
	step("SIGSTOP: restarted by the watchdog")

	// An engine that is down does not fail the start, nor trip the
	// watchdog: the unit is active and says why it is not attached.
	attachURL := eng.AttachURL() // the same while the engine restarts
	restarted := make(chan error, 1)
	go func() { restarted <- eng.Restart(12 * time.Second) }()
	serviceGone(t, w)
	must("systemctl restart fluksio-worker")
	if state := strings.TrimSpace(must("systemctl is-active fluksio-worker")); state != "active" {
		t.Errorf("restarted while the engine is down, the service is %s", state)
	}
	eventuallyIn(t, 10*time.Second, "StatusText to say why it is not attached", func() (bool, string) {
		text := show("StatusText")["StatusText"]
		return strings.HasPrefix(text, "not attached to "+attachURL+", retrying: "), text
	})
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	liveWorker(ctx, t, eng)
	if n := show("NRestarts")["NRestarts"]; n != "0" {
		t.Errorf("with the engine down for 12 s (six watchdog periods), the service restarted %s times", n)
	}
	step("engine down: active, says why, no watchdog restart")
}

// freeLoopbackAddr is a loopback address with a port nothing listens on now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
