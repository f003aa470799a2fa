package platform

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// ServiceManager is the worker's side of systemd's notify protocol
// (sd_notify(3)): READY=1 once it is up, RELOADING=1 and READY=1 around a
// reload, STOPPING=1, a one-line STATUS= that `systemctl status` shows, and
// WATCHDOG=1 pings when the unit sets WatchdogSec=. The protocol itself is
// github.com/coreos/go-systemd/v22/daemon, as in the Buildkite agent.
//
// Outside systemd (no NOTIFY_SOCKET: a terminal, a batch job, launchd) every
// method does nothing, so callers never ask where they run.
type ServiceManager struct {
	log      *slog.Logger
	enabled  bool
	watchdog time.Duration

	mu         sync.Mutex
	lastStatus string
	failed     bool // a send failed once; said in the log once
}

// Variables the service manager hands the worker alone. A runner that saw
// them could speak for the worker (NotifyAccess=main ignores it, but a
// library in node code may still try), so they are not passed on.
var serviceManagerVars = []string{"NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC"}

// NewServiceManager reads what systemd told this process: where to notify,
// and the watchdog period if this process is the one watched.
func NewServiceManager(log *slog.Logger) *ServiceManager {
	m := &ServiceManager{log: log}
	m.enabled = os.Getenv("NOTIFY_SOCKET") != ""
	if m.enabled {
		m.watchdog, _ = daemon.SdWatchdogEnabled(false)
	}
	return m
}

// Enabled reports whether a service manager is listening.
func (m *ServiceManager) Enabled() bool { return m.enabled }

// WatchdogPeriod is WatchdogSec= of the unit, or 0 without a watchdog.
// Pings must come at least this often; sd_notify(3) advises twice as often.
func (m *ServiceManager) WatchdogPeriod() time.Duration { return m.watchdog }

// Ready says the worker is up. Sent again after a reload.
func (m *ServiceManager) Ready() { m.send(daemon.SdNotifyReady) }

// Reloading says the worker is rereading its configuration; Ready follows
// when it is done. MONOTONIC_USEC lets Type=notify-reload units (systemd 253
// and later) match the reload to the request.
func (m *ServiceManager) Reloading() {
	m.send(daemon.SdNotifyReloading + "\n" + strings.TrimSuffix(daemon.SdNotifyMonotonicUsec(), "\n"))
}

// Stopping says the worker is on its way out, so systemctl shows
// "deactivating" while calls are stopped or drained.
func (m *ServiceManager) Stopping() { m.send(daemon.SdNotifyStopping) }

// Stopped sets the last status line: stopped, why and the exit code, so
// that `systemctl status` of a unit that ended (failed, or waiting for its
// restart) says what happened instead of what the worker was doing before.
// Sent just before the worker exits.
func (m *ServiceManager) Stopped(code int, why string) {
	m.Status(fmt.Sprintf("stopped: %s (exit code %d)", why, code))
}

// Status sets the line `systemctl status` shows. Sending the same line again
// is skipped.
func (m *ServiceManager) Status(line string) {
	if !m.enabled {
		return
	}
	line = strings.ReplaceAll(line, "\n", " ")
	m.mu.Lock()
	same := line == m.lastStatus
	m.lastStatus = line
	m.mu.Unlock()
	if !same {
		m.send("STATUS=" + line)
	}
}

// Watchdog pings the watchdog. Only the worker's main loop calls it, so a
// worker whose loop is stuck stops pinging and systemd restarts it.
func (m *ServiceManager) Watchdog() {
	if m.watchdog > 0 {
		m.send(daemon.SdNotifyWatchdog)
	}
}

func (m *ServiceManager) send(state string) {
	if !m.enabled {
		return
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		m.mu.Lock()
		first := !m.failed
		m.failed = true
		m.mu.Unlock()
		if first && m.log != nil {
			m.log.Warn("could not notify the service manager", "error", err)
		}
	}
}

// WithoutServiceManager returns env without the variables systemd meant for
// the worker alone, for the processes it starts.
func WithoutServiceManager(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		keep := true
		for _, name := range serviceManagerVars {
			if strings.HasPrefix(kv, name+"=") {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
