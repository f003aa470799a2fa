// Package runner owns a call's runner process, from its start to the
// moment nothing of it is left: it starts the process contained (its own
// process group, a cookie in its environment, a cgroup per call where the
// worker may make them, a raised oom_score_adj, a private call directory,
// a sandbox where the worker has one), or hands out a warm one (warm.go):
// a spare, started ahead of its call (spare.go) or, where each call has a
// cgroup, forked from its environment's zygote, an interpreter that loaded
// the runtime once (zygote.go). Whichever way a runner starts, one launch
// owns what the start makes until the runner runs (launch.go). The package
// writes the request on the runner's stdin; relays its stdout lines (events
// to the engine through a callback, the answer to the caller), its stderr
// to the log, and what its node prints as the call's log events
// (nodeout.go); and stops it with the stop ladder: SIGTERM to everything of
// the call, --cancel-grace to finish, SIGKILL, then a sweep of what is left.
//
// It knows nothing of the engine's session: the caller owns the call as
// the engine sees it (heartbeats, the answer, the worker's own error
// answers) and stops a runner by cancelling the context it was started
// with, the cause a *StopError.
package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/platform"
)

// Config is what starting runners takes from the worker's configuration.
type Config struct {
	Python      string        // absolute path of the interpreter
	StateDir    string        // where call directories are made
	BaseEnv     []string      // every runner's environment, before its request's env
	CancelGrace time.Duration // how long a stopped node may clean up (--cancel-grace)
	MaxLine     int64         // the longest runner line (--max-line)
	Spares      int           // warm spare runners in all; 0 starts every runner cold
	Preload     []string      // modules spares of the embedded runtime import (--preload)
	// OutsizedRequest is the request size from which the memory a written
	// request took is given back to the system at once; 0 never.
	OutsizedRequest int
	Log             *slog.Logger
	Metrics         *metrics.Metrics // nil-safe: nil without --listen
	NodeLog         NodeLog          // how a node's stderr lines are logged (--node-log-level)
	Sandbox         *Sandbox         // every runner's sandbox (SetupSandbox); nil: none
	// AdoptArtifacts takes into the worker's artifact cache what a
	// sandboxed call fetched into its own (the directory given), once the
	// call's processes are gone; nil: nothing is taken.
	AdoptArtifacts func(own string)

	dirs    *callDirs    // the pool's call directories kept for reuse; set by NewPool
	cgroups *callCgroups // the pool's calls' cgroups kept for reuse; set by NewPool
}

// NodeLog is the level a node's stderr lines are logged at, or Off: a
// node's own log, apart from the worker's (--node-log-level).
type NodeLog struct {
	Level slog.Level
	Off   bool
}

// env adds a request's env to the worker's own; later entries win.
func (c *Config) env(extra []string) []string {
	return append(c.BaseEnv[:len(c.BaseEnv):len(c.BaseEnv)], extra...)
}

// Runtime is the runner script a runner's interpreter executes.
type Runtime struct {
	Path     string
	Embedded bool // the worker's own runtime, the one that knows --preload
	// Bytecode is Path compiled by the interpreter (runtime.WithBytecode),
	// if it could be; CompiledBy is the interpreter's file as it was then.
	Bytecode   string
	CompiledBy os.FileInfo
}

// script is what the interpreter is given to run: the compiled runtime
// where there is one (no compile at each start), while the interpreter is
// still the file that compiled it. An interpreter replaced since (an
// upgrade to another Python version) could not load that bytecode: its
// runners start from the source until the worker attaches again and
// compiles it anew.
func (c *Config) script(rt Runtime) string {
	if rt.Bytecode == "" {
		return rt.Path
	}
	if st, err := os.Stat(c.Python); err == nil && platform.Unchanged(st, rt.CompiledBy) {
		return rt.Bytecode
	}
	interpreterChanged.Do(func() {
		c.Log.Info("the Python interpreter changed since the runner script was compiled for it; runners start from its source until the worker attaches again",
			"python", c.Python)
	})
	return rt.Path
}

// interpreterChanged says once that runners start from source.
var interpreterChanged sync.Once

// Pool starts runners: a warm spare when one of the call's environment is
// ready, else a new one. It lives as long as the session loop of the
// worker; Close stops the spares.
type Pool struct {
	cfg  Config
	warm *warmPool // nil without spares
	// behind counts the cleanup that ended calls left to finish off their
	// path (Process.End): removing their cgroups and directories; and the
	// making of boxes ahead.
	behind sync.WaitGroup
	boxes  *boxesAhead
}

// NewPool starts keeping cfg.Spares spare runners.
func NewPool(cfg Config) *Pool {
	p := &Pool{cfg: cfg}
	p.cfg.dirs = &callDirs{}
	if callCgroupsSet() != nil {
		p.cfg.cgroups = newCallCgroups(p.cfg.Log)
	}
	p.warm = newWarmPool(&p.cfg)
	p.boxes = &boxesAhead{cfg: &p.cfg, behind: &p.behind}
	return p
}

// Close stops every spare and waits until all of them are gone, and until
// the cleanup of the calls that ended is done: nothing of the pool's is
// left when it returns. Runners started from the pool are their callers'
// to end, before Close.
func (p *Pool) Close() {
	p.warm.close()
	p.boxes.close()
	p.behind.Wait()
	p.boxes.discard()
	p.cfg.dirs.close()
	p.cfg.cgroups.close()
}

// Spec is one call's runner.
type Spec struct {
	CallID  string // the call's id, for the log events the worker sends itself
	Runtime Runtime
	Env     []string     // the request's env, added to Config.BaseEnv
	Request []byte       // the request line for stdin; not kept once written
	Log     *slog.Logger // the call's logger
	// Send sends an event frame to the engine. The frame is the socket
	// writer's from then on; it gives it back with frame.Put.
	Send func(frame []byte)
}

// StopError is the cause a runner's context is cancelled with when the
// worker stops its call: Reason is the answer's message should the runner
// not answer by itself; "" keeps protocol.MsgNodeStopped.
type StopError struct{ Reason string }

func (e *StopError) Error() string {
	if e.Reason == "" {
		return protocol.MsgNodeStopped
	}
	return e.Reason
}

// Stopped is the *StopError ctx was cancelled with, or nil while it is
// not cancelled. A context cancelled without one counts as a stop without
// a reason.
func Stopped(ctx context.Context) *StopError {
	if ctx.Err() == nil {
		return nil
	}
	var stop *StopError
	if errors.As(context.Cause(ctx), &stop) {
		return stop
	}
	return &StopError{}
}

// Output is how a runner's stdout ended.
type Output struct {
	Answer []byte // the answer line, as a text frame, when there was one
	Err    error  // a line over --max-line; otherwise the output just ended
}

// Process is one started runner. Its context's cancellation, the end of
// its call (End), or its stdout outliving it starts the stop ladder, which
// one goroutine (watch) runs once.
type Process struct {
	cfg      *Config
	log      *slog.Logger
	box      *box
	stdin    io.WriteCloser
	stdout   *output
	stderr   *os.File
	pipes    *nodePipes  // the node's output pipes (embedded runtime only)
	out      *nodeOutput // their relay; nil without them
	dir      *callDir
	warmDone func()          // tells the warm pool the call ended
	behind   *sync.WaitGroup // the pool's cleanup after calls (End)
	boxes    *boxesAhead     // the pool's boxes made ahead, for a cold start

	halted context.Context         // done once the stop ladder is due
	halt   context.CancelCauseFunc // makes it due, for the worker's own reasons

	exited chan struct{} // closed when the runner process is reaped
	// gone closes once the runner process exited: a runner forked from a
	// zygote is a zombie then until the zygote reaps it; for another
	// runner it is exited.
	gone       chan struct{}
	stopped    chan struct{} // closed when the stop ladder is over
	outputs    chan Output   // the one Output, once stdout ended
	outputDone chan struct{} // closed once stdout ended
	stderrDone chan struct{} // closed once stderr is relayed to its end
}

// Reasons the worker halts a runner without stopping its call.
var (
	errOutputHeld = errors.New("the runner exited but its output did not end")
	errCallEnded  = errors.New("the call ended")
)

// The stop ladder's timings. --cancel-grace (Config.CancelGrace) is the
// user's; these are the worker's own.
const (
	// pipeLinger is how long a runner's output may stay open after the
	// runner itself exited: a grandchild that inherited stdout (a forked
	// data loader, say) must not keep the call from ending.
	//
	// os/exec's WaitDelay does not fit here: it closes the pipes a fixed
	// time after the process exits, losing output the engine was slow to
	// take, while this reads on for as long as output keeps coming.
	pipeLinger = 500 * time.Millisecond

	// runnerAnswerMargin is how long after --cancel-grace the runner's
	// group gets SIGKILL: the runner lets the node clean up for exactly the
	// grace (FLUKSIO_CANCEL_GRACE), then answers NodeCancelled itself,
	// which takes milliseconds; a second covers a loaded machine.
	runnerAnswerMargin = time.Second

	// stopPoll is how often a stopping group is checked for being gone,
	// once its leader is: no event says when the rest of a process group
	// is gone (one does for a cgroup: CallCgroup.WaitEmpty).
	stopPoll = 10 * time.Millisecond

	// reapWait bounds how long the end of a call waits for processes it
	// killed to become zombies, so they can be reaped.
	reapWait = time.Second
)

// Start starts a runner for spec (a spare when one fits), writes the
// request on its stdin and relays its output. ctx is the call's: cancel it
// with a *StopError to stop the runner. When ctx is already cancelled,
// nothing starts and the error is its *StopError; any other error says why
// the runner could not start.
func (pl *Pool) Start(ctx context.Context, spec Spec) (*Process, error) {
	if stop := Stopped(ctx); stop != nil {
		return nil, stop
	}
	begun := time.Now()
	p := &Process{
		cfg:        &pl.cfg,
		log:        spec.Log,
		behind:     &pl.behind,
		boxes:      pl.boxes,
		exited:     make(chan struct{}),
		stopped:    make(chan struct{}),
		outputs:    make(chan Output, 1),
		outputDone: make(chan struct{}),
		stderrDone: make(chan struct{}),
	}
	sp, warmDone := pl.warm.take(spec.Runtime, spec.Env)
	p.warmDone = warmDone
	var stdout *os.File
	if sp != nil {
		p.box, p.gone, p.stdin, stdout, p.stderr, p.pipes, p.dir = sp.handTo(spec.Log, p.exited)
		p.log.Debug("runner is a spare", "pid", p.box.pid)
	} else {
		var err error
		p.gone = p.exited // reaped by the worker itself, as it exits
		if stdout, err = p.startCold(spec); err != nil {
			warmDone()
			return nil, err
		}
	}
	pl.cfg.Metrics.RunnerStarted(time.Since(begun))
	p.stdout = &output{f: stdout}
	// A stop asked from now on, even before watch runs, halts the runner.
	p.halted, p.halt = context.WithCancelCause(ctx)
	if p.pipes != nil {
		p.out = relayNodeOutput(p, p.pipes, spec.CallID, spec.Send)
	}
	go p.watch()
	go p.write(spec.Request)
	go func() {
		p.relayStderr()
		close(p.stderrDone)
	}()
	go func() {
		p.outputs <- p.relayStdout(spec.Send)
		close(p.outputDone)
	}()
	return p, nil
}

// startCold starts a new interpreter in a new box; it returns the read
// end of its stdout.
func (p *Process) startCold(spec Spec) (*os.File, error) {
	l := newLaunch(p.cfg, p.log)
	defer l.close() // all of it, where it did not start
	if err := l.stdio(true); err != nil {
		return nil, err
	}
	b, dir, err := p.boxes.take(p.log)
	if err != nil {
		return nil, err
	}
	l.dir = dir
	args := []string{p.cfg.script(spec.Runtime)}
	var extra []*os.File
	if spec.Runtime.Embedded {
		if args, extra, err = l.passNodePipes(args, extra); err != nil {
			b.teardown()
			return nil, err
		}
	}
	cmd, err := l.exec(b, args, extra, p.cfg.env(spec.Env), false, spec.Runtime.Path)
	if err != nil {
		return nil, err
	}
	p.box, p.stdin, p.stderr, p.pipes, p.dir = b, l.stdin, l.stderr, l.nodes, l.dir
	l.handOver()
	go func() {
		err := cmd.Wait()
		b.reaped(cmd)
		p.log.Debug("runner exited", "pid", b.pid, "status", exitStatus(err))
		close(p.exited)
	}()
	return l.stdout, nil
}

// write writes the request on the runner's stdin. A runner that died
// before reading gets EPIPE here; its missing answer is reported by the
// output ending, not by this write.
func (p *Process) write(request []byte) {
	p.stdin.Write(request)
	if p.cfg.OutsizedRequest > 0 && len(request) >= p.cfg.OutsizedRequest {
		request = nil
		frame.Release()
	}
}

// Output delivers how the runner's stdout ended, once.
func (p *Process) Output() <-chan Output { return p.outputs }

// watch runs the stop ladder once it is due: when the call's context is
// cancelled, when End is called, or when the runner exited and its stdout
// stayed open for pipeLinger (something else holds the pipe, or there is
// still output the engine is slow to take). After the ladder the output is
// read on only while it keeps coming.
//
// The ladder is not os/exec's Cancel: Cancel is called only while Wait has
// not returned, but the ladder must also reach the rest of the group, the
// cookie carriers and the cgroup after the runner itself exited; and a
// spare's Cmd is made before its call's context exists.
func (p *Process) watch() {
	defer close(p.stopped)
	exited, outputDone := p.exited, p.outputDone
	var linger <-chan time.Time
	for {
		select {
		case <-p.halted.Done():
			p.stopLadder()
			p.stdout.drain()
			return
		case <-outputDone:
			outputDone, exited, linger = nil, nil, nil
		case <-exited:
			exited = nil
			linger = time.After(pipeLinger)
		case <-linger:
			linger = nil
			p.halt(errOutputHeld)
		}
	}
}

// stopLadder sends SIGTERM to everything of the call, waits up to
// --cancel-grace (and the moment the runner needs to answer after it) for
// it to be gone, then sends SIGKILL.
func (p *Process) stopLadder() {
	if !p.box.signalAll(syscall.SIGTERM) {
		return
	}
	until := time.Now().Add(p.cfg.CancelGrace + runnerAnswerMargin)
	deadline := time.NewTimer(time.Until(until))
	defer deadline.Stop()
	// While the runner lives its group does; only then is there anything
	// to poll for.
	select {
	case <-p.exited:
	case <-deadline.C:
		p.kill()
		return
	}
	// The kernel says when the call's cgroup is empty: the call's slot
	// passes on at that moment, not at the next look of the poll below
	// (which still finds a group member a root node moved out of it).
	if g := p.box.cg; g != nil && g.WaitEmpty(time.Until(until)) && !p.box.anyAlive() {
		return
	}
	tick := time.NewTicker(stopPoll)
	defer tick.Stop()
	for p.box.anyAlive() {
		select {
		case <-tick.C:
		case <-deadline.C:
			p.kill()
			return
		}
	}
}

func (p *Process) kill() {
	p.log.Warn("the runner did not stop within --cancel-grace; killing it", "grace", p.cfg.CancelGrace)
	p.box.signalAll(syscall.SIGKILL)
}

// Kill sends SIGKILL to everything of the call at once, for a worker told
// twice to stop.
func (p *Process) Kill() { p.box.signalAll(syscall.SIGKILL) }

// DeathMessage says why a runner ended without answering, when the worker
// did not stop it: the signal that killed it, or its exit code.
func (p *Process) DeathMessage() string { return p.box.deathMessage(p.exited) }

// End ends the runner once its call is over for the engine, and returns
// as soon as no process of it is left: every process of the call gone (its
// cgroup empty), every pipe closed. The Usage it returns says what the
// runner cost, for the call's end record; where End returned before the
// runner's exit was reported (below), it waits for that report. What is
// only cleanup, the cgroup's removal (the kernel lets it go some
// milliseconds after its last process) and the call directory's, goes on
// behind, off the path of the call that takes the slot next; Pool.Close
// waits for it. answered gives a runner that answered the grace period to
// exit by itself.
//
// A runner forked from a zygote is the zygote's child: its exit is
// reported once the zygote reaped it, which takes the zygote being
// scheduled (tenths of a millisecond, milliseconds on a loaded machine).
// The kernel says sooner that it exited (its pidfd); once it did and its
// cgroup, which holds every process of the call, is empty, End returns,
// and the next call may start: what is left of this one is a zombie. The
// rest (the process group's last check, a member a root node moved out of
// the cgroup stopped as always, the pipes, the figures) follows the
// report, off the slot.
func (p *Process) End(answered bool) func() Usage {
	p.stdin.Close()
	if answered {
		select {
		case <-p.gone:
		case <-time.After(p.cfg.CancelGrace):
		}
	}
	if p.gone != p.exited && closed(p.gone) && !closed(p.exited) && p.box.cg != nil && !p.box.cg.Populated() {
		p.warmDone()
		reported := make(chan struct{})
		var u Usage
		p.behind.Go(func() {
			<-p.exited
			u = p.finish()
			close(reported)
		})
		return func() Usage {
			<-reported
			return u
		}
	}
	u := p.finish()
	p.warmDone()
	return func() Usage { return u }
}

// finish stops what is left of the call, closes its pipes and says what
// it cost; its cleanup goes on behind.
func (p *Process) finish() Usage {
	p.halt(errCallEnded)
	<-p.stopped
	p.box.sweep()
	p.stdout.f.Close()
	// A process that left the group (setsid) may still hold stderr.
	p.stderr.SetReadDeadline(time.Now().Add(pipeLinger))
	<-p.stderrDone
	p.stderr.Close()
	p.out.stop()
	p.pipes.close()
	<-p.exited
	usage := p.box.usage()
	reuse := p.box.emptied()
	p.behind.Go(func() {
		p.box.teardown()
		p.boxes.sweep()
		if p.cfg.Sandbox != nil && p.cfg.AdoptArtifacts != nil {
			p.cfg.AdoptArtifacts(ownArtifacts(p.dir))
		}
		if err := p.cfg.dirs.recycle(p.dir, reuse); err != nil {
			p.log.Warn("could not remove the call's directory", "dir", p.dir.path, "error", err)
		}
	})
	return usage
}

func exitStatus(err error) string {
	if err == nil {
		return "0"
	}
	return err.Error()
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
