package agent

import (
	"log/slog"
	"time"

	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// outage is how long the worker has been without the engine, and how many
// attempts to attach have failed since: what each retry's log line,
// `status` and the next "attached" line say. Serve's goroutine alone uses
// it.
type outage struct {
	since    time.Time // when the connection was lost, or Serve began
	attempts int       // attempts to attach that failed since
	lost     bool      // the worker was attached before: since is when that connection was lost
}

// retrying says, in one line, why the worker is about to wait wait and
// attach again: the connection it had was lost (attached), or an attempt
// to attach failed, counted, with how long the worker has been down.
func (a *Agent) retrying(attached bool, err error, wait time.Duration) {
	now := time.Now()
	in := wait.Round(time.Millisecond).String()
	if attached {
		a.outage = outage{since: now, lost: true}
		a.log.Warn("connection lost; reconnecting", "error", err, "retry_in", in)
	} else {
		a.outage.attempts++
		a.log.Warn("cannot reach the engine; retrying", "attempt", a.outage.attempts,
			"down_for", downFor(now.Sub(a.outage.since)), "error", err, "retry_in", in)
	}
	a.life.connecting(err.Error(), a.outage.since, a.outage.attempts)
}

// reattached is what the "attached" line says about the outage it ends,
// which it then forgets: how long the worker was away after a lost
// connection, and the attempts that failed.
func (a *Agent) reattached(now time.Time) []any {
	var attrs []any
	if a.outage.lost {
		attrs = append(attrs, "away", downFor(now.Sub(a.outage.since)))
	}
	if a.outage.attempts > 0 {
		attrs = append(attrs, "failed_attempts", a.outage.attempts)
	}
	a.outage = outage{since: now}
	return attrs
}

// downFor is an outage's length as a log line shows it: to the second
// from a minute on, to a tenth below.
func downFor(d time.Duration) string {
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// advertised is the inventory the hello told the engine, as the
// "attached" line shows it.
func advertised(h protocol.Hello) slog.Attr {
	var ram any = "unknown"
	if h.Inventory.RAMMB != nil {
		ram = *h.Inventory.RAMMB
	}
	return slog.Group("inventory", "cpus", h.Inventory.CPUs, "gpus", h.Inventory.GPUs, "ram_mb", ram, "max_parallel", h.MaxParallel)
}
