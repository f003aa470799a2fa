package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/engine"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// RunCommand is `fluksio-worker run`: attach and serve in the foreground
// until stopped (SIGTERM/SIGINT), drained (SIGQUIT), idle (--max-idle) or
// refused. SIGHUP reloads: it re-executes this binary in place once the
// running calls finish (reload.go).
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	tuneGC(os.Getenv)
	cfg, err := config.Load(args, os.Getenv)
	if err == nil {
		err = cfg.Resolve()
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		WriteRunUsage(stdout)
		return config.ExitOK
	case errors.Is(err, config.ErrVersion):
		fmt.Fprintf(stdout, "fluksio-worker %s\n", Version)
		return config.ExitOK
	case err != nil:
		fmt.Fprintf(stderr, "%sfluksio-worker: %s\n", logging.PriorityPrefix(stderr), logging.NewRedactor(cfg.Token).Scrub(err.Error()))
		return config.ExitUsage
	}
	log := logging.NewLogger(stderr, cfg.LogFormat, cfg.LogLevel, cfg.Token)
	for _, w := range cfg.Warnings {
		log.Warn("check the configuration", "warning", w)
	}
	service := platform.NewServiceManager(log)
	if service.Enabled() {
		// A panic exits 2, which the unit reads as a bad configuration and
		// does not restart (RestartPreventExitStatus); dying of SIGABRT,
		// with every goroutine's stack in the journal, it is restarted.
		debug.SetTraceback("crash")
	}
	python, pyVersion, err := platform.FindPython(ctx, cfg.Python)
	if err != nil {
		log.Error("cannot run node code", "error", err)
		return exiting(log, service, config.ExitUsage, "no Python to run node code on")
	}
	stateDir, err := config.ResolveStateDir(cfg, os.Getenv)
	if err != nil {
		log.Error("cannot use the state directory", "error", err)
		return exiting(log, service, config.ExitUsage, "the state directory cannot be used")
	}
	lock, err := config.LockStateDir(stateDir)
	if err != nil {
		log.Error("cannot use the state directory", "error", err)
		return exiting(log, service, config.ExitUsage, "another worker holds the state directory")
	}
	defer lock.Release()
	if n, err := runner.ClearLeftovers(stateDir); err != nil {
		log.Warn("could not remove what an earlier worker left in the state directory", "error", err)
	} else if n > 0 {
		log.Info("removed what an earlier worker, killed outright, left in the state directory", "removed", n)
	}
	// Resolved now: after an upgrade replaced the file, the path is what
	// a reload executes.
	exe, exeErr := Executable()
	if cfg.Listen != "" {
		// A taken address ends the start before anything is set up for
		// calls; it is bound for good once the worker is made, below.
		if err := metrics.CheckListen(cfg.Listen); err != nil {
			log.Error("cannot serve monitoring", "error", err)
			return exiting(log, service, config.ExitUsage, "--listen cannot be served")
		}
	}
	contain := runner.SetupContainment(log, cfg.Containment)
	if err := runner.SetCallLimits(contain, cfg.CallLimits()); err != nil {
		log.Error("cannot hold calls to their limits", "error", err)
		return exiting(log, service, config.ExitUsage, "a per-call limit cannot be had here")
	}
	if l := cfg.CallLimits(); l.Any() {
		log.Info("each call is held to the machine owner's limits on its cgroup", "memory_max_bytes", l.MemoryMax, "pids_max", l.PidsMax, "cpu_max", l.CPUMax)
	}
	sb, sandbox, ok := setupSandbox(log, cfg, exe, exeErr, stateDir)
	if !ok {
		return exiting(log, service, config.ExitUsage, "no sandbox can be had here")
	}
	log.Info("starting", "version", Version, "engine", logging.ShownURL(cfg.URL), "python", python,
		"python_version", pyVersion, "state_dir", stateDir, "parallel", cfg.Parallel, "containment", contain,
		"sandbox", sandbox, "warm", runner.WarmShown(cfg.WarmSpares()))
	log.Debug("spare runners", "warm", runner.WarmDetail(cfg.WarmSpares(), sb))
	if cfg.Policy.On() || cfg.PreCallHook != "" || cfg.PostCallHook != "" {
		log.Info("the machine owner's code policy and hooks are in force", "policy", cfg.PolicyText())
	}
	a := New(cfg, log, python, stateDir)
	a.sandbox = sb
	defer a.status.Close() // its last write, before the state directory is let go
	a.status.Update(func(s *status.Status) {
		s.Containment, s.Sandbox, s.Warm, s.WarmDetail = contain, sandbox, runner.WarmShown(cfg.WarmSpares()), runner.WarmDetail(cfg.WarmSpares(), sb)
		s.Limits = cfg.LimitsText()
	})
	if cfg.Listen != "" {
		srv, err := a.ListenMonitoring()
		if err != nil {
			log.Error("cannot serve monitoring", "error", err)
			return exiting(log, service, config.ExitUsage, "--listen cannot be served")
		}
		defer srv.Close()
		log.Info("serving /metrics, /healthz and /livez", "listen", srv.Addr())
	}

	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP)
	defer signal.Stop(signals)
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx) }()
	// This loop is the worker's main loop: it pulses (which feeds
	// systemd's watchdog and /healthz) and handles signals. Nothing in it
	// waits on the engine, so an engine outage never starves the watchdog.
	pulse := time.NewTicker(pulseInterval(service.WatchdogPeriod()))
	defer pulse.Stop()
	attaching := a.Attaching()
	service.Status(a.Pulse())
	// A reload is checked before it begins (reloadcheck.go); checked
	// carries the verdict, nil while no check runs.
	var checked chan error
	for {
		select {
		case <-attaching:
			// Ready once configured and dialing: an engine that is down
			// at boot must not fail the unit (the worker keeps retrying).
			attaching = nil
			service.Ready()
		case <-pulse.C:
			service.Status(a.Pulse())
			service.Watchdog()
		case err := <-served:
			if errors.Is(err, ErrReload) {
				signal.Stop(signals)
				return exiting(log, service, a.reexec(exe, exeErr, service.Reloading), "a reload could not execute the binary")
			}
			service.Stopping()
			code, why := exitCode(log, err)
			if err == nil {
				why = a.EndReason()
			}
			a.exited(code, why)
			return exiting(log, service, code, why)
		case err := <-checked:
			checked = nil
			if err != nil {
				a.refuseReload(err)
				break
			}
			a.status.Update(func(s *status.Status) { s.ReloadRefused = nil })
			a.Reload()
		case sig := <-signals:
			switch {
			case sig == syscall.SIGHUP && checked != nil:
				log.Info("SIGHUP: the reload asked before is still being checked")
			case sig == syscall.SIGHUP:
				logReloadRequest(log, a)
				if exeErr != nil {
					a.refuseReload(exeErr)
					break
				}
				checked = make(chan error, 1)
				go func() { checked <- checkReload(ctx, exe, cfg.Listen) }()
			case sig == syscall.SIGQUIT:
				log.Info("SIGQUIT: draining")
				a.endBecause("SIGQUIT: drained")
				a.Drain()
			case !a.life.mode().ending():
				// The first stop signal: the lifecycle is told (Stop), so
				// the next one finds the worker stopping, and kills.
				a.endBecause(signalName(sig) + ": stopped")
				log.Info("stopping (a second signal stops at once)", "signal", sig.String())
				service.Stopping()
				a.Stop()
			default:
				log.Warn("stop signal again: killing running calls and exiting now", "signal", sig.String())
				a.Kill()
				select {
				case <-served:
				case <-time.After(time.Second):
				}
				why := signalName(sig) + " twice: running calls killed"
				a.exited(config.ExitOK, why)
				return exiting(log, service, config.ExitOK, why)
			}
		}
	}
}

// exitCode is the exit code for Serve's result and why, said once.
func exitCode(log *slog.Logger, err error) (code int, why string) {
	var refused *protocol.RefusedError
	var usage *config.UsageError
	var never *NeverAttachedError
	switch {
	case err == nil:
		return config.ExitOK, ""
	case errors.As(err, &refused):
		log.Error("the engine refused this worker; not retrying (a new token or an engine-side change is needed)", "reason", refused.Reason)
		return config.ExitRefused, "refused by the engine"
	case errors.As(err, &usage):
		log.Error("bad configuration", "error", err)
		return config.ExitUsage, "bad configuration"
	case errors.As(err, &never):
		log.Error("--max-idle ran out and this worker never attached to the engine: check --url, the token and the network",
			"max_idle", never.MaxIdle.String(), "last_error", never.Last)
		return config.ExitNeverAttached, "never attached to the engine within --max-idle"
	default:
		log.Error("the worker failed", "error", err)
		return config.ExitFailed, "the worker failed"
	}
}

// exiting writes the worker's last record, why it stops and its exit
// code, sets systemd's status line to the same, and returns the code.
// Every way out of `run` once it has a logger goes through here, so the
// journal's last word about a worker, and `systemctl status`'s, is this.
func exiting(log *slog.Logger, service *platform.ServiceManager, code int, why string) int {
	service.Stopped(code, why)
	level := slog.LevelInfo
	if code != config.ExitOK {
		level = slog.LevelError
	}
	log.Log(context.Background(), level, "exiting", "reason", why, "exit_code", code)
	return code
}

// exited says in the status file why the worker ends and with which exit
// code, as exiting says it to the log and systemd, for `status` to show
// after the process is gone.
func (a *Agent) exited(code int, why string) {
	a.status.Update(func(s *status.Status) { s.Exit = &status.Exit{Code: code, Reason: why, At: time.Now().UTC()} })
}

// signalName is a signal as a user writes it: SIGTERM.
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return name
		}
	}
	return sig.String()
}

// pulseInterval is how often the main loop pulses: every PulseInterval, or
// twice per watchdog period when systemd asks for pings more often than
// that, as sd_notify(3) advises.
func pulseInterval(watchdog time.Duration) time.Duration {
	if watchdog > 0 && watchdog/2 < PulseInterval {
		return max(watchdog/2, time.Millisecond)
	}
	return PulseInterval
}

// WriteRunUsage prints `run --help`, generated from the option table.
func WriteRunUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: fluksio-worker [run] --url URL [--token-file PATH] [options]

Attach to a Fluksio engine and run the calls it sends, in the foreground.
Each call runs in a fresh Python process; its output streams back live.

Every option can also be set as the environment variable shown, or as a key
of the same name in the --config file; flags win over variables, variables
over the file. A DURATION is seconds (300), a duration (5m, 1h30m) or days
(7d), as everywhere in fluksio-worker.

Options:
  --config PATH  [FLUKSIO_WORKER_CONFIG]
        read settings from a TOML file: url = "wss://...", labels = ["gpu"]
`)
	for _, o := range config.Options {
		head := "--" + o.Name + " " + o.Arg
		if o.Env() != "" {
			head += "  [" + o.Env() + "]"
		}
		config.WriteOption(w, head, o.HelpWithDefault())
	}
	fmt.Fprint(w, `  --version
        print the version

Signals: SIGTERM or SIGINT stops running calls (reported to the engine as
cancelled) and exits 0; a second one kills them at once. SIGQUIT drains:
running calls finish, new ones are declined, then it exits 0. SIGHUP
reloads: new calls are declined, running ones finish (at most
--reload-timeout), then the binary on disk is executed again in this process
with the same arguments, and attaches anew.
Exit codes: 0 stopped, drained, idle or done with --max-calls; 1 refused by
the engine; 2 bad usage; 3 a reload could not execute the binary; 4 idle for
--max-idle without ever attaching to the engine.
`)
}

// InventoryCommand is `fluksio-worker inventory`: what this machine would
// advertise in hello, as JSON.
func InventoryCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(args, os.Getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, "Usage: fluksio-worker inventory [--cpus N] [--gpus N] [--ram-mb MB] [--labels A,B] [--python P] [--config PATH]\n\nPrints the hello this worker would send the engine, as JSON: its name,\nlabels, Python, max_parallel, venv_digest and what it holds (inventory).\n\nExit status: 0 printed, 2 bad options.")
		return config.ExitOK
	case err != nil:
		fmt.Fprintf(stderr, "fluksio-worker: %v\n", err)
		return config.ExitUsage
	}
	a := &Agent{cfg: cfg}
	if python, _, err := platform.FindPython(ctx, cfg.Python); err == nil {
		a.python = python
	} else {
		fmt.Fprintf(stderr, "fluksio-worker: warning: %v\n", err)
	}
	hello := a.hello(ctx)
	if a.python == "" {
		hello.VenvDigest = ""
	}
	// Exactly the hello, nothing the engine is not told: the containment,
	// this machine's business, is in check and status.
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.Encode(hello)
	return config.ExitOK
}

// CheckAttach dials the engine, says hello and waits for the welcome, then
// closes: the check `install` and `check` make. The error wraps a
// *protocol.RefusedError when the engine said no.
func CheckAttach(ctx context.Context, cfg config.Config) error {
	a := &Agent{cfg: cfg}
	if python, _, err := platform.FindPython(ctx, cfg.Python); err == nil {
		a.python = python
	}
	return engine.CheckAttach(ctx, cfg, a.hello(ctx))
}
