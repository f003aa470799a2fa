package agent

// What the worker says about itself while it runs, beyond the status file:
// the line systemd shows, the health /healthz answers, the metrics, and the
// --max-calls budget.

import (
	"fmt"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// PulseInterval is how often the worker's main loop pulses (see Pulse)
// when systemd asks nothing faster: often enough that `systemctl status`
// is current, rarely enough to cost nothing.
const PulseInterval = time.Second

// loopStale is how long without a pulse before /healthz and /livez call
// the main loop stuck: ten missed pulses, so a busy machine is not mistaken for a
// wedged worker.
const loopStale = 10 * PulseInterval

// Pulse is called by the worker's main loop at every PulseInterval. It
// takes the agent's lock, so a worker wedged on it stops pulsing (and
// systemd's watchdog, fed only after a pulse, restarts it); it marks the
// loop alive for /healthz; and it returns the line for `systemctl status`.
// Nothing the engine does can hold it up.
func (a *Agent) Pulse() string {
	running, done := a.book.doneSoFar()
	a.loopBeat.Store(time.Now().UnixNano())
	return statusLine(a.status.Get(), running, done)
}

// statusLine is one line for `systemctl status`: attached as which name to
// which engine (never the token), or why not; the calls running and done.
func statusLine(st status.Status, running int, done int64) string {
	var what string
	switch {
	case st.Name != "" && st.State == status.StateAttached:
		what = fmt.Sprintf("attached as %q to %s", st.Name, st.Engine)
	case st.Name != "":
		what = fmt.Sprintf("%s, attached as %q to %s", st.State, st.Name, st.Engine)
	case st.State == status.StateRefused:
		what = fmt.Sprintf("refused by %s: %s", st.Engine, logging.FirstLine(st.LastError))
	case st.State == status.StateConnecting && st.LastError != "":
		what = fmt.Sprintf("not attached to %s, retrying: %s", st.Engine, logging.FirstLine(st.LastError))
	case st.LastError != "": // draining or reloading through an outage
		what = fmt.Sprintf("%s, not attached to %s, retrying: %s", st.State, st.Engine, logging.FirstLine(st.LastError))
	default:
		what = fmt.Sprintf("%s to %s", st.State, st.Engine)
	}
	return fmt.Sprintf("%s; calls: %d running, %d done", what, running, done)
}

// Health is /healthz: healthy while the main loop pulses and the worker is
// attached, or was within --health-grace (a reconnection after an engine
// restart is not an outage). Before the first welcome it is unhealthy: it
// has never been able to take a call.
func (a *Agent) Health() (ok bool, reason string) {
	ok, reason = a.health(time.Now())
	return ok, a.redact.Scrub(reason)
}

func (a *Agent) health(now time.Time) (bool, string) {
	if ok, why := a.looping(now); !ok {
		return false, why
	}
	if why := a.shortOfDisk(); why != "" {
		return false, "declining calls: " + why
	}
	st := a.status.Get()
	if st.Name != "" && st.State != status.StateConnecting {
		return true, fmt.Sprintf("ok: %s as %q to %s", st.State, st.Name, st.Engine)
	}
	why := logging.FirstLine(st.LastError)
	if why == "" {
		why = st.State
	}
	if n := len(a.book.held()); n > 0 {
		why = fmt.Sprintf("%d call(s) held through the outage; %s", n, why)
	}
	left := a.detachedAt.Load()
	if left == 0 {
		return false, fmt.Sprintf("not attached to %s yet: %s", st.Engine, why)
	}
	gone := now.Sub(time.Unix(0, left)).Round(time.Second)
	if gone <= a.cfg.HealthGrace {
		return true, fmt.Sprintf("ok: reconnecting to %s (attached %s ago, within --health-grace %s): %s", st.Engine, gone, a.cfg.HealthGrace, why)
	}
	return false, fmt.Sprintf("not attached to %s for %s (over --health-grace %s): %s", st.Engine, gone, a.cfg.HealthGrace, why)
}

// Live is /livez, Kubernetes' liveness probe: alive while the main loop
// pulses, whatever the engine does. Only a restart mends a worker whose
// main loop is stuck; an engine outage is not mended by one (/healthz, the
// readiness probe, reports that).
func (a *Agent) Live() (ok bool, reason string) { return a.looping(time.Now()) }

func (a *Agent) looping(now time.Time) (bool, string) {
	if beat := a.loopBeat.Load(); beat != 0 {
		if quiet := now.Sub(time.Unix(0, beat)); quiet > loopStale {
			return false, fmt.Sprintf("stuck: the worker's main loop has not run for %s", quiet.Round(time.Second))
		}
	}
	return true, "ok: the worker's main loop runs"
}

// Attaching is closed when the first attempt to attach starts: the worker
// is configured and on its way, whether or not the engine answers.
func (a *Agent) Attaching() <-chan struct{} { return a.attaching }

// attemptStarted marks the start of an attempt to attach.
func (a *Agent) attemptStarted() {
	a.metrics.AttachAttempt()
	a.attachOnce.Do(func() { close(a.attaching) })
}

// welcomed marks the engine's welcome.
func (a *Agent) welcomed() {
	a.everWelcomed.Store(true)
	a.metrics.Welcomed()
}

// detached marks an attached connection lost.
func (a *Agent) detached() {
	a.detachedAt.Store(time.Now().UnixNano())
	a.metrics.Disconnected()
}

// ListenMonitoring serves /metrics, /healthz and /livez on --listen. The caller
// closes the server.
func (a *Agent) ListenMonitoring() (*metrics.Server, error) {
	srv, err := metrics.Listen(a.cfg.Listen, a.metrics, a.Health, a.Live, a.log)
	if err != nil {
		return nil, &config.UsageError{Err: err}
	}
	if to := metrics.Exposure(a.cfg.Listen); to != "" {
		a.log.Warn("the monitoring port is open beyond this machine; bind 127.0.0.1 or firewall it unless that is meant",
			"listen", srv.Addr(), "open_to", to)
	}
	a.status.Update(func(s *status.Status) { s.Listen = srv.Addr() })
	return srv, nil
}
