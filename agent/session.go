package agent

// A session is one connection to the engine, from the dial to its end, and
// its attachment what the connection's messages and calls are handled
// with. Calls started on it end with it, unless the resume extension lets
// them outlive it (adopt; resume.go holds them).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluksio/fluksio-worker/agent/engine"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/hold"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/agent/runtime"
)

// attachment is what one connection's messages are handled with.
type attachment struct {
	ctx    context.Context // ends when the connection does
	cancel context.CancelFunc
	conn   *engine.Conn
	rt     runner.Runtime  // the runner script of this connection's calls
	calls  *sync.WaitGroup // every goroutine serving a call of this connection
	// noise budgets the log lines about engine messages the worker ignores
	// or refuses, so an engine that floods them cannot flood the log.
	noise *logging.Budget

	// With the resume extension (resume.go): whether the engine's resume
	// answer came (or its wait ended), and the timer of that wait.
	resumed     atomic.Bool
	resumeTimer *time.Timer
}

// engineNoisePerSecond is how many log lines a second the engine's ignored
// or refused messages may cause; the rest are counted.
const engineNoisePerSecond = 10

// errFinished ends a session on purpose: stopped, drained or idle.
var errFinished = errors.New("finished")

// session is one connection: dial, hello, welcome, then calls until the
// connection is lost or the worker finishes. It reports whether the
// engine welcomed this worker. Every call started on the connection is
// stopped and gone when it returns, or held (resume.go).
func (a *Agent) session(ctx context.Context) (attached bool, err error) {
	prepare, cancelPrepare := a.preparing(ctx)
	defer cancelPrepare()
	conn, rt, err := a.attach(prepare)
	if err != nil {
		return false, err
	}
	at := a.newAttachment(ctx, conn, rt)
	defer a.detach(at)
	if conn.ResumeGrace() > 0 {
		a.offerHeld(at)
	} else {
		a.stopAllHeld(msgNoResume)
	}
	at.calls.Add(1)
	go a.beatWaiting(at)
	return true, a.serveConnection(ctx, at, a.readEngine(at))
}

// preparing is the context of getting ready to attach: it gives up as soon
// as the worker is told to stop or drain, since nothing is running yet that
// would need to finish.
func (a *Agent) preparing(ctx context.Context) (context.Context, context.CancelFunc) {
	prepare, cancelPrepare := context.WithCancel(ctx)
	a.attemptStarted()
	// Calls held through an outage are running calls: a drain or reload
	// waits for them, so the worker attaches again to let them finish.
	held := len(a.book.held()) > 0
	go func() {
		defer cancelPrepare()
		for {
			m, modeC := a.life.watch()
			if m.ending() || m.declining() && !held {
				return
			}
			select {
			case <-modeC:
			case <-prepare.Done():
				return
			}
		}
	}()
	return prepare, cancelPrepare
}

// attach makes the runner script ready, says hello and waits for the
// welcome; the worker is then attached.
func (a *Agent) attach(prepare context.Context) (*engine.Conn, runtime.Script, error) {
	began := time.Now()
	rt, err := runtime.Ensure(prepare, a.cfg, a.stateDir, a.log)
	if err != nil {
		return nil, rt, err
	}
	rt = runtime.WithBytecode(prepare, a.python, rt, a.log)
	helloAt := time.Now()
	hello := a.hello(prepare)
	dialAt := time.Now()
	// Most of the seconds before the first attach are pip freeze, run for
	// the hello's venv_digest; the debug line says so, with the numbers.
	a.log.Debug("hello ready; dialing", "runtime_ms", helloAt.Sub(began).Milliseconds(),
		"hello_ms", dialAt.Sub(helloAt).Milliseconds(), "note", "the first hello_ms is mostly pip freeze, hashed as venv_digest; later ones reuse it")
	conn, name, err := engine.Attach(prepare, a.cfg, hello)
	if err != nil {
		a.log.Debug("attach failed", "dial_ms", time.Since(dialAt).Milliseconds(), "error", err)
		return nil, rt, err
	}
	since := time.Now()
	a.log.Debug("welcomed", "dial_hello_welcome_ms", since.Sub(dialAt).Milliseconds(), "total_ms", since.Sub(began).Milliseconds())
	a.welcomed()
	a.log.Info("attached", append([]any{"engine", logging.ShownURL(a.cfg.URL), "name", name, "labels", hello.Labels,
		advertised(hello), "runtime", rt.Source, "runtime_hash", rt.Hash[:12]}, a.reattached(since)...)...)
	a.life.attached(name, since)
	a.book.restartIdle() // a fresh connection starts the idle clock
	return conn, rt, nil
}

// newAttachment is what conn's messages and calls are handled with.
func (a *Agent) newAttachment(ctx context.Context, conn *engine.Conn, rt runtime.Script) *attachment {
	at := &attachment{conn: conn, calls: &sync.WaitGroup{},
		rt:    runner.Runtime{Path: rt.Path, Embedded: rt.Source == "embedded", Bytecode: rt.Bytecode, CompiledBy: rt.CompiledBy},
		noise: logging.NewBudget(a.log, "log lines about ignored or refused engine messages were dropped", engineNoisePerSecond)}
	at.ctx, at.cancel = context.WithCancel(ctx)
	return at
}

// detach ends the attachment, in this order: its calls are told the
// connection is gone (those that cannot outlive it stop), the calls
// waiting for a slot are dropped (the engine reschedules them), then every
// goroutine of the connection is waited for, so that nothing of it writes
// to the socket or the log any more; the socket goes; and last, the calls
// that outlive it are held, once nothing of this connection sends them.
func (a *Agent) detach(at *attachment) {
	at.cancel()
	a.dropWaiting()
	at.calls.Wait()
	at.noise.Close()
	at.conn.Abort()
	if at.resumeTimer != nil {
		at.resumeTimer.Stop()
	}
	a.holdCalls()
}

// readEngine reads the engine's messages and handles each, until the
// connection is lost: the error comes on the channel returned.
func (a *Agent) readEngine(at *attachment) <-chan error {
	lost := make(chan error, 1)
	go func() {
		for {
			data, err := at.conn.Read()
			if err != nil {
				lost <- err
				return
			}
			a.handle(at, data)
			if len(data) >= frame.Outsized {
				data = nil
				frame.Release()
			}
		}
	}()
	return lost
}

// serveConnection follows the worker's mode, its calls and its idle clock
// while the connection lives, until it is lost or the worker finishes on
// it (errFinished).
func (a *Agent) serveConnection(ctx context.Context, at *attachment, lost <-chan error) error {
	ctxDone := ctx.Done()
	// seen is the mode this loop has acted on; the first pass acts on
	// the mode the worker is in already.
	seen, stopped := modeServing, false
	first := make(chan struct{})
	close(first)
	var modeC <-chan struct{} = first
	reload := a.newReloadWait()
	defer reload.stop()
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	var idleC <-chan time.Time // nil without --max-idle: never idle
	if a.cfg.MaxIdle > 0 {
		idleC = idle.C
		a.armIdle(idle)
	}
	for {
		select {
		case err := <-lost:
			return fmt.Errorf("connection lost: %w", err)
		case <-ctxDone:
			ctxDone, stopped = nil, true
			a.stopAll(msgStopping)
		case <-modeC:
			var now mode
			now, modeC = a.life.watch()
			if now == seen {
				break
			}
			seen = now
			switch now {
			case modeKilling:
				return errFinished
			case modeStopping:
				if stopped {
					break
				}
				stopped = true
				a.log.Info("stopping: running calls are being stopped")
				a.stopAll(msgStopping)
			case modeDraining:
				a.log.Info("draining: running calls finish, new calls are refused")
			case modeReloading:
				reload.begin()
			}
		case <-reload.expired:
			reload.expire()
		case <-a.changed:
			a.armIdle(idle)
			reload.changed()
		case <-idleC:
			if a.running() == 0 && time.Now().After(a.idleDeadline()) {
				a.endBecause("nothing ran for --max-idle")
				a.log.Info("nothing ran for --max-idle; stopping", "max_idle", a.cfg.MaxIdle.String())
				at.conn.Close()
				return errFinished
			}
			a.armIdle(idle)
		}
		if (stopped || seen.declining()) && a.running() == 0 {
			at.conn.Close()
			return errFinished
		}
	}
}

// adopt makes c a call of at: on a connection that accepted the extension
// its frames go through a journal and it outlives the connection; on any
// other, it is the connection's and stops with it.
func (at *attachment) adopt(a *Agent, c *call) {
	c.rt = at.rt
	c.wg = at.calls
	c.attached = at.ctx
	c.session = at.ctx
	if grace := at.conn.ResumeGrace(); grace > 0 {
		c.grace = grace
		lim := holdLimits
		lim.Shared = a.heldDisk
		c.journal = hold.New(at.conn, a.heldDir(), lim)
		c.journal.SetAck(at.conn.ResumeAck())
		c.session, c.release = context.WithCancel(context.Background())
		c.wg = &a.outliving
	}
}

// abandon lets go of what adopt made for a call that is refused.
func (c *call) abandon() {
	if c.release != nil {
		c.release()
	}
}
