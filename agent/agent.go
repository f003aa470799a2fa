package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluksio/fluksio-worker/agent/artifacts"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/hold"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// Version is the binary's version, set by main: the status file and the
// metrics carry it, and run and selftest say it as they start.
var Version = "dev"

// Reconnection backoff: 1 s, doubling to 30 s, reset after a welcome.
const (
	backoffMin = time.Second
	backoffMax = 30 * time.Second
)

// Agent holds the worker's state across connections: the running calls and
// the stop, drain and idle decisions. One Agent serves until it is told to
// stop, is refused, drained or idle.
type Agent struct {
	cfg      config.Config
	log      *slog.Logger
	python   string // absolute path of the interpreter
	stateDir string
	baseEnv  []string
	status   *status.File
	redact   *logging.Redactor // the token out of text the worker shows
	metrics  *metrics.Metrics  // nil without --listen
	runners  *runner.Pool      // starts runners, keeps the warm spares
	sandbox  *runner.Sandbox   // every call's (setupSandbox); nil: none
	digests  *platform.VenvDigests

	// The artifacts calls load (FLUKSIO_ARTIFACT_CACHE), trimmed by
	// keepCache, woken through cacheUsed (disk.go).
	artifactDir string
	artifacts   *artifacts.Cache
	cacheUsed   chan struct{}

	attaching    chan struct{} // closed when the first attempt to attach starts
	attachOnce   sync.Once
	loopBeat     atomic.Int64 // when the main loop last pulsed (unix ns)
	detachedAt   atomic.Int64 // when the last attached connection was lost (unix ns)
	everWelcomed atomic.Bool  // the engine welcomed this worker at least once
	outage       outage       // since when it is not attached, and the attempts since (retry.go)

	endMu  sync.Mutex
	endWhy string // why the worker is to finish, said in its last record

	book    *callBook     // the calls, their slots and counts (book.go)
	changed chan struct{} // a call started or ended

	// outliving counts the goroutines of calls that may outlive their
	// connection (the resume extension, resume.go); Serve waits for them.
	outliving sync.WaitGroup
	// heldDisk bounds the held calls' spill files together
	// (--held-disk-max); nil (a Config without it) bounds only each.
	heldDisk *hold.Budget
	// resumeWait bounds the wait for the engine's resume answer:
	// resumeAnswerTimeout, shorter in tests (export_test.go).
	resumeWait time.Duration

	life *lifecycle // serving, or reloading, draining, stopping, killing (mode.go)
}

// New prepares an agent. python is the resolved interpreter.
func New(cfg config.Config, log *slog.Logger, python, stateDir string) *Agent {
	a := &Agent{
		cfg:      cfg,
		log:      log,
		python:   python,
		stateDir: stateDir,
		changed:  make(chan struct{}, 1),

		attaching: make(chan struct{}),
		digests:   platform.NewVenvDigests(python),

		resumeWait: resumeAnswerTimeout,
	}
	if cfg.HeldDiskMax > 0 {
		a.heldDisk = hold.NewBudget(cfg.HeldDiskMax)
	}
	if cfg.Listen != "" {
		a.metrics = metrics.New(Version, protocol.Version)
	}
	a.baseEnv = runnerBaseEnv(cfg, stateDir, platform.WithoutServiceManager(os.Environ()), os.Getenv, log)
	a.artifactDir = artifactCacheDir(stateDir, os.Getenv)
	a.artifacts = artifacts.New(a.artifactDir)
	a.cacheUsed = make(chan struct{}, 1)
	a.redact = logging.NewRedactor(cfg.Token)
	// A reload re-executes the worker in place, so the status file this
	// process wrote before it is its own: the calls done so far count on,
	// as `status` showed them.
	var done int64
	var declined map[string]int64
	if prev, err := status.Read(stateDir); err == nil && prev.PID == os.Getpid() {
		done, declined = prev.CallsDone, prev.CallsDeclined
	}
	a.book = newCallBook(cfg.Parallel, cfg.MaxCalls, done)
	a.status = status.NewFile(stateDir, status.Status{
		PID:           os.Getpid(),
		Version:       Version,
		Engine:        logging.ShownURL(cfg.URL),
		State:         status.StateConnecting,
		CallsDone:     done,
		CallsDeclined: declined,
		Policy:        cfg.PolicyText(),
	}, a.redact, func(err error) { log.Debug("could not write the status file", "error", err) })
	a.life = newLifecycle(a.status)
	return a
}

// endBecause records why the worker is to finish, for its last log
// record; the first reason wins (a drain that --max-calls began, then a
// SIGTERM, ended because of --max-calls).
func (a *Agent) endBecause(why string) {
	a.endMu.Lock()
	defer a.endMu.Unlock()
	if a.endWhy == "" {
		a.endWhy = why
	}
}

// EndReason is why the worker finished, once Serve returned nil.
func (a *Agent) EndReason() string {
	a.endMu.Lock()
	defer a.endMu.Unlock()
	return a.endWhy
}

// NeverAttachedError is what Serve returns when --max-idle ran out and the
// engine never welcomed this worker: a batch job with a wrong URL or
// token must not end as if it had done its work.
type NeverAttachedError struct {
	MaxIdle time.Duration
	Last    error // why the last attempt failed
}

func (e *NeverAttachedError) Error() string {
	return fmt.Sprintf("never attached to the engine in --max-idle %s; the last attempt: %v", e.MaxIdle, e.Last)
}

func (e *NeverAttachedError) Unwrap() error { return e.Last }

// Stop stops every running call (each answered NodeCancelled, "the worker
// is stopping"), closes the connection cleanly, and makes Serve return.
func (a *Agent) Stop() { a.life.ask(modeStopping) }

// Drain answers new calls NodeCancelled ("the worker is draining"), lets
// running ones finish, then makes Serve return.
func (a *Agent) Drain() { a.life.ask(modeDraining) }

// Kill stops every call's process group at once, for a second signal.
func (a *Agent) Kill() {
	a.life.ask(modeKilling)
	a.book.eachLive((*call).kill)
}

// Serve attaches and reattaches until the worker should stop. It returns
// nil for a stop, a drain or an idle exit, ErrReload when the worker is to
// re-execute itself, and a *protocol.RefusedError when the engine will not have
// this worker.
func (a *Agent) Serve(ctx context.Context) (err error) {
	// Spares live as long as Serve: they are gone when it returns, before
	// a reload executes the binary again.
	a.runners = runner.NewPool(a.runnerConfig())
	defer func() {
		a.runners.Close()
		if !errors.Is(err, ErrReload) { // a reload shows reloading until the exec
			a.life.ended("")
		}
		a.status.Flush()
	}()
	a.removeStaleSpills()
	held, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go a.watchHeld(held)
	go a.keepCache(held)
	backoff := backoffMin
	a.outage = outage{since: time.Now()}
	for {
		attached, err := a.session(ctx)
		if a.over(err) {
			return a.finish()
		}
		var refused *protocol.RefusedError
		var usage *config.UsageError
		if errors.As(err, &refused) {
			a.metrics.Refused()
		}
		if errors.As(err, &refused) || errors.As(err, &usage) {
			a.life.refused(err.Error())
			a.abandonAll(err.Error())
			a.outliving.Wait()
			return err
		}
		if ctx.Err() != nil {
			a.finish()
			return nil
		}
		if attached {
			backoff = backoffMin
			a.detached()
		}
		// Jitter spreads a fleet's reconnections after an engine restart.
		wait := backoff/2 + rand.N(backoff/2+1)
		if attached {
			// Right after a drop a whole fleet retries at once: the first
			// retry is spread over 0-2 s (equal jitter on 1 s would put a
			// fifth of the fleet in each of the first 100 ms); the later
			// ones keep equal jitter on a doubling backoff.
			wait = rand.N(firstRetrySpread + 1)
		}
		backoff = min(backoff*2, backoffMax)
		if limit := a.heldRetryLimit(); limit > 0 && wait > limit {
			// An engine back within the grace must find its calls held.
			wait = limit/2 + rand.N(limit/2+1)
		}
		a.retrying(attached, err, wait)
		if done, idle := a.waitOffline(ctx, wait); done {
			if idle && !a.everWelcomed.Load() {
				return &NeverAttachedError{MaxIdle: a.cfg.MaxIdle, Last: err}
			}
			return a.finish()
		}
	}
}

// firstRetrySpread is the window the first retry after a lost connection
// falls in.
const firstRetrySpread = 2 * time.Second

// over says whether the worker should finish after a session that ended
// with err: stopped, killed or finished on purpose; drained or reloading
// once no call is held through an outage (those wait for held calls as
// they wait for running ones).
func (a *Agent) over(err error) bool {
	m := a.life.mode()
	if errors.Is(err, errFinished) || m.ending() {
		return true
	}
	return m.declining() && len(a.book.held()) == 0
}

// finish stops what is still held (nobody can hear it now) and waits for
// every call's goroutine, then says how Serve ends.
func (a *Agent) finish() error {
	a.abandonAll(msgStopping)
	a.outliving.Wait()
	return a.finished()
}

// waitOffline sleeps between connections. It reports done when the worker
// should exit instead: stopped, or drained or reloaded with nothing held
// through the outage, or idle, and whether it was idle.
func (a *Agent) waitOffline(ctx context.Context, wait time.Duration) (done, idle bool) {
	retry := time.NewTimer(wait)
	defer retry.Stop()
	var idleC <-chan time.Time
	if a.cfg.MaxIdle > 0 && a.running() == 0 {
		t := time.NewTimer(time.Until(a.idleDeadline()))
		defer t.Stop()
		idleC = t.C
	}
	// A drain or reload with calls held keeps reconnecting, so that they
	// can finish; the session then waits for them as for any running call.
	for {
		_, modeC := a.life.watch()
		if a.over(nil) {
			return true, false
		}
		select {
		case <-retry.C:
			return false, false
		case <-idleC:
			a.endBecause("nothing ran for --max-idle")
			a.log.Info("nothing ran for --max-idle; stopping", "max_idle", a.cfg.MaxIdle.String())
			return true, true
		case <-a.changed: // a held call ended
		case <-modeC:
		case <-ctx.Done():
			return true, false
		}
	}
}

// hello describes this worker. The inventory is taken afresh for each
// connection: a GPU added between connections is advertised on the next
// one. The venv digest is taken once and again when the interpreter's
// package directories change, in the background (platform.VenvDigests): a
// package installed is advertised once its digest is taken.
func (a *Agent) hello(ctx context.Context) protocol.Hello {
	name := a.cfg.Name
	if name == "" {
		name, _ = os.Hostname()
	}
	python := a.cfg.Python
	if python == "" {
		python = a.python
	}
	labels := a.cfg.Labels
	if labels == nil {
		labels = []string{}
	}
	digest := a.digests.Get // a serving agent's, kept between connections
	if a.digests == nil {   // inventory and check say hello once
		digest = func(ctx context.Context) string { return platform.VenvDigest(ctx, a.python) }
	}
	return protocol.Hello{
		Op:          protocol.OpHello,
		Protocol:    protocol.Version,
		Name:        name,
		Labels:      labels,
		Python:      python,
		MaxParallel: a.cfg.Parallel,
		VenvDigest:  digest(ctx),
		Inventory:   protocol.Inventory(platform.DetectInventory(a.cfg.Overrides())),
	}
}

// armIdle points the idle timer at the moment this worker becomes idle.
func (a *Agent) armIdle(t *time.Timer) {
	if a.cfg.MaxIdle <= 0 {
		return
	}
	wait := time.Until(a.idleDeadline())
	if a.running() > 0 {
		wait = time.Hour // a running call is never idle; its end re-arms
	}
	t.Reset(max(wait, 0))
}

func (a *Agent) idleDeadline() time.Time {
	return a.book.idleSince().Add(a.cfg.MaxIdle)
}

func (a *Agent) running() int { return a.book.running() }

// stopAll stops every running call and answers every waiting one, each
// with reason; no waiting call is started. An answer sent that waits for
// the engine's acknowledgement (resume.go) waits no more: a stopping
// worker keeps nothing for later.
func (a *Agent) stopAll(reason string) {
	a.answerWaiting(reason)
	a.book.each(func(c *call) {
		c.stop(reason)
		if c.journal != nil {
			c.journal.Ack()
		}
	})
}

// notify wakes the session loop after a call started or ended.
func (a *Agent) notify() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// runnerConfig is what the agent's runners are started with.
func (a *Agent) runnerConfig() runner.Config {
	return runner.Config{
		Python:          a.python,
		StateDir:        a.stateDir,
		BaseEnv:         a.baseEnv,
		CancelGrace:     a.cfg.CancelGrace,
		MaxLine:         a.cfg.MaxLine,
		Spares:          a.cfg.WarmSpares(),
		Preload:         a.cfg.Preload,
		OutsizedRequest: frame.Outsized,
		Log:             a.log,
		Metrics:         a.metrics,
		NodeLog:         nodeLog(a.cfg.NodeLogLevel),
		Sandbox:         a.sandbox,
		AdoptArtifacts:  func(own string) { a.artifacts.Adopt(own) },
	}
}

// nodeLog reads --node-log-level.
func nodeLog(level string) runner.NodeLog {
	switch level {
	case "off":
		return runner.NodeLog{Off: true}
	case "debug":
		return runner.NodeLog{Level: slog.LevelDebug}
	}
	return runner.NodeLog{Level: slog.LevelInfo}
}
