package agent

// A reload is how an upgrade or a new setting reaches a running worker
// without killing its calls (SIGHUP; systemd's ExecReload sends it). The
// worker stops taking calls (declined NodeCancelled, as a drain declines
// them, so the engine places them elsewhere), lets the running ones finish
// and answers them on the connection it has, then re-executes the binary on
// disk in place: same PID, same arguments and environment, so the service
// manager sees no restart, and the new process reads the new binary, the new
// config and writes the new runtime. With nothing running it re-executes at
// once. --reload-timeout bounds the wait: then the calls left are stopped as
// a stop stops them, and the reload goes on.
//
// What wins when a reload meets a drain, a stop or a second reload is the
// worker's mode (mode.go): the one reload re-reads whatever is on disk when
// it happens. A reload while disconnected re-executes at once unless calls
// are held through the outage (resume.go): those are waited for as running
// calls are.

import (
	"errors"
	"fmt"
	"log/slog"

	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// msgReloading declines calls that arrive while a reload waits.
const msgReloading = "the worker is reloading"

// msgReloadTimeout is the answer of a call stopped because the reload
// waited --reload-timeout for it.
const msgReloadTimeout = "the worker is reloading and --reload-timeout ran out"

// ErrReload is what Serve returns when the worker is to re-execute itself.
var ErrReload = errors.New("reload")

// Reload asks for a graceful reload; asking again while one waits does
// nothing more.
func (a *Agent) Reload() {
	if before, _ := a.life.ask(modeReloading); before > modeReloading {
		a.log.Info("reload ignored: the worker is already stopping or draining")
	}
}

// reloading says whether a reload has been asked and is not overruled by a
// stop or a drain: new calls are declined with msgReloading.
func (a *Agent) reloading() bool { return a.life.mode() == modeReloading }

// finished is what Serve returns when the worker is done on purpose: nil,
// or ErrReload when a reload (not overruled by a stop or drain) ended it.
func (a *Agent) finished() error {
	if a.reloading() {
		return ErrReload
	}
	return nil
}

// reloadWait is one session's part of a reload: it begins when asked, waits
// for the running calls, and stops them when --reload-timeout runs out.
// Only the session loop uses it.
type reloadWait struct {
	a       *Agent
	expired <-chan time.Time // --reload-timeout; nil without one
	timer   *time.Timer
	begun   bool
}

func (a *Agent) newReloadWait() *reloadWait { return &reloadWait{a: a} }

// begin starts waiting for the running calls, unless a stop or drain
// overruled the reload since.
func (r *reloadWait) begin() {
	a := r.a
	if !a.reloading() {
		return
	}
	r.begun = true
	limit := "none"
	if d := a.cfg.ReloadTimeout; d > 0 {
		// Armed even with nothing running: a call that slipped in as the
		// reload began is bounded too.
		r.timer = time.NewTimer(d)
		r.expired = r.timer.C
		limit = d.String()
	}
	running := a.runningIDs()
	if len(running) == 0 {
		a.log.Info("reloading: nothing is running")
		return
	}
	a.log.Info("reloading once the running calls finish; new calls are declined",
		"calls", running, "reload_timeout", limit)
	since := time.Now().UTC()
	a.status.Update(func(s *status.Status) {
		s.Reload = &status.Reload{Since: since, Waiting: running}
		if r.timer != nil {
			s.Reload.Deadline = since.Add(a.cfg.ReloadTimeout)
		}
	})
}

// changed keeps the status's list of calls the reload waits for current.
func (r *reloadWait) changed() {
	if !r.begun {
		return
	}
	running := r.a.runningIDs()
	r.a.status.Update(func(s *status.Status) {
		if s.Reload != nil {
			s.Reload.Waiting = running
		}
	})
}

// expire stops the calls still running when --reload-timeout ran out.
func (r *reloadWait) expire() {
	r.expired = nil
	if !r.a.reloading() {
		return // a drain or stop took over: it decides what happens to the calls
	}
	r.a.log.Warn("--reload-timeout ran out: stopping the calls still running", "calls", r.a.runningIDs(),
		"reload_timeout", r.a.cfg.ReloadTimeout.String())
	r.a.stopAll(msgReloadTimeout)
}

func (r *reloadWait) stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
}

func (a *Agent) runningIDs() []string {
	var ids []string
	a.book.each(func(c *call) { ids = append(ids, c.id) })
	slices.Sort(ids)
	return ids
}

// Executable is the binary a reload re-executes: this process's, resolved
// when it starts. After a package upgrade /proc/self/exe names the deleted
// old file; the path stays the installed one, which now holds the new binary.
func Executable() (string, error) {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return "", fmt.Errorf("cannot tell where this binary is, so a reload could not re-execute it: %w", err)
	}
	return exe, nil
}

// reexec replaces this process with exe, with the same arguments and
// environment: nothing is added, so the token is exactly where it was (the
// config file, a variable or, if the operator put it there, a flag). Every
// descriptor Go opens (the socket, call pipes, files) is close-on-exec, and
// by now the connection is closed and every call gone. It returns only when
// the exec failed. reloading tells a Type=notify service manager
// (RELOADING=1) right before the exec, not at the start of the wait: a
// manager told that makes `systemctl reload`, and so a package's postinst,
// block until READY=1, which could be hours of running calls. The new
// process says READY=1 once it dials.
func (a *Agent) reexec(exe string, exeErr error, reloading func()) int {
	if exeErr != nil {
		a.log.Error("cannot reload", "error", exeErr)
		a.life.ended("reload: " + exeErr.Error())
		a.status.Flush()
		return config.ExitReloadFailed
	}
	a.log.Info("reloading: executing the binary on disk", "path", exe)
	a.status.Update(func(s *status.Status) { s.Reload = nil }) // it shows reloading, its mode
	a.status.Flush()
	// A SIGHUP between the exec and the new process's signal handler would
	// kill it (the default action), and systemd counts death by SIGHUP as
	// clean, so it would not restart it. Ignored signals stay ignored
	// across exec; the new process handles SIGHUP again once it starts.
	signal.Ignore(syscall.SIGHUP)
	reloading()
	err := syscall.Exec(exe, os.Args, os.Environ())
	a.log.Error("cannot reload: executing the binary failed; exiting so the service manager restarts it",
		"path", exe, "error", err)
	a.life.ended("reload: " + err.Error())
	a.status.Flush()
	return config.ExitReloadFailed
}

// refuseReload keeps the worker serving when the binary on disk would not
// start with the configuration: it logs why, and status shows it until the
// next reload is asked.
func (a *Agent) refuseReload(err error) {
	a.log.Error("reload refused: the binary on disk would not start with this configuration; this worker keeps serving as it is (fix the cause, then reload again)",
		"error", err)
	at := time.Now().UTC()
	a.status.Update(func(s *status.Status) { s.ReloadRefused = &status.ReloadRefused{At: at, Reason: err.Error()} })
}

// logReloadRequest says what a SIGHUP does in the worker's current state.
func logReloadRequest(log *slog.Logger, a *Agent) {
	if a.life.mode() == modeReloading {
		log.Info("SIGHUP: a reload is already waiting")
		return
	}
	log.Info("SIGHUP: reloading (running calls finish first)")
}
