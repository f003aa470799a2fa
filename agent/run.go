package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fluksio/fluksio-worker/platform"
)

// Version is the binary's version, set by main.
var Version = "dev"

// Exit codes of `run`.
const (
	ExitOK      = 0 // stopped, drained or idle
	ExitRefused = 1 // the engine refused this worker, or it failed
	ExitUsage   = 2 // a usage or configuration error
)

// RunCommand is `fluksio-worker run`: attach and serve in the foreground
// until stopped (SIGTERM/SIGINT), drained (SIGQUIT), idle (--max-idle) or
// refused. SIGHUP reloads: it re-executes this binary in place once the
// running calls finish (reload.go).
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	tuneGC(os.Getenv)
	cfg, err := Load(args, os.Getenv)
	if err == nil {
		err = cfg.Resolve()
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		WriteRunUsage(stdout)
		return ExitOK
	case errors.Is(err, ErrVersion):
		fmt.Fprintf(stdout, "fluksio-worker %s\n", Version)
		return ExitOK
	case err != nil:
		fmt.Fprintf(stderr, "fluksio-worker: %s\n", NewRedactor(cfg.Token).Scrub(err.Error()))
		return ExitUsage
	}
	log := NewLogger(stderr, cfg.LogFormat, cfg.LogLevel, cfg.Token)
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	service := platform.NewServiceManager(log)
	python, pyVersion, err := platform.FindPython(ctx, cfg.Python)
	if err != nil {
		log.Error("cannot run node code: " + err.Error())
		return ExitUsage
	}
	stateDir, err := ResolveStateDir(cfg, os.Getenv)
	if err != nil {
		log.Error(err.Error())
		return ExitUsage
	}
	// Resolved now: after an upgrade replaced the file, the path is what
	// a reload executes.
	exe, exeErr := Executable()
	contain := SetupContainment(log, cfg.Containment)
	log.Info("starting", "version", Version, "engine", RedactURL(cfg.URL), "python", python,
		"python_version", pyVersion, "state_dir", stateDir, "parallel", cfg.Parallel, "containment", contain)
	a := New(cfg, log, python, stateDir)
	a.status.Update(func(s *Status) { s.Containment = contain })
	if cfg.Listen != "" {
		srv, err := a.ListenMonitoring()
		if err != nil {
			log.Error(err.Error())
			return ExitUsage
		}
		defer srv.Close()
		log.Info("serving /metrics and /healthz", "listen", srv.Addr())
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
	stopping := false
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
				return a.reexec(exe, exeErr, service.Reloading)
			}
			service.Stopping()
			return exitCode(log, err)
		case sig := <-signals:
			switch {
			case sig == syscall.SIGHUP:
				logReloadRequest(log, a)
				a.Reload()
			case sig == syscall.SIGQUIT:
				log.Info("SIGQUIT: draining")
				a.Drain()
			case !stopping:
				stopping = true
				log.Info(sig.String() + ": stopping (a second signal stops at once)")
				service.Stopping()
				a.Stop()
			default:
				log.Warn(sig.String() + " again: killing running calls and exiting now")
				a.Kill()
				select {
				case <-served:
				case <-time.After(time.Second):
				}
				return ExitOK
			}
		}
	}
}

func exitCode(log interface{ Error(string, ...any) }, err error) int {
	var refused *RefusedError
	var usage *UsageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &refused):
		log.Error(refused.Error() + "; not retrying (a new token or an engine-side change is needed)")
		return ExitRefused
	case errors.As(err, &usage):
		log.Error(err.Error())
		return ExitUsage
	default:
		log.Error(err.Error())
		return ExitRefused
	}
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
over the file.

Options:
  --config PATH  [FLUKSIO_WORKER_CONFIG]
        read settings from a TOML file: url = "wss://...", labels = ["gpu"]
`)
	for _, o := range Options {
		head := "  --" + o.Name + " " + o.Arg
		if o.Env() != "" {
			head += "  [" + o.Env() + "]"
		}
		fmt.Fprintln(w, head)
		for _, line := range wrap(o.Help, 70) {
			fmt.Fprintln(w, "        "+line)
		}
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
the engine; 2 bad usage; 3 a reload could not execute the binary.
`)
}

// wrap breaks text into lines of at most width characters, at spaces.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(lines, line)
}

// InventoryCommand is `fluksio-worker inventory`: what this machine would
// advertise in hello, as JSON.
func InventoryCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := Load(args, os.Getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, "Usage: fluksio-worker inventory [--cpus N] [--gpus N] [--ram-mb MB] [--labels A,B] [--python P] [--config PATH]\n\nPrints what this worker would tell the engine it holds, as JSON.")
		return ExitOK
	case err != nil:
		fmt.Fprintf(stderr, "fluksio-worker: %v\n", err)
		return ExitUsage
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
	// The containment is this machine's, not the engine's business: it is
	// shown here but not sent in hello.
	mode := ProbeContainment(cfg.Containment)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.Encode(struct {
		Hello
		Containment string `json:"containment"`
	}{hello, mode})
	return ExitOK
}

// Probe dials the engine, says hello and waits for the welcome, then
// closes: the check `install` and `check` make. The error wraps a
// *RefusedError when the engine said no.
func Probe(ctx context.Context, cfg Config) error {
	a := &Agent{cfg: cfg}
	if python, _, err := platform.FindPython(ctx, cfg.Python); err == nil {
		a.python = python
	}
	hello := a.hello(ctx)
	ws, _, err := dialEngine(ctx, cfg)
	if err != nil {
		return err
	}
	defer ws.Close()
	if _, err := greet(ws, hello); err != nil {
		// Callers print it: the engine's reason may quote the token.
		return NewRedactor(cfg.Token).redactError(err)
	}
	ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, "check done"), time.Now().Add(closeWait))
	return nil
}
