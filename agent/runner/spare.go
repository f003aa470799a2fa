package runner

// A spare: one runner process started ahead of its call (warm.go says
// which and when), its life as one state (spareState), and how it is
// started, waited for, handed to its call or discarded. A zygote's process
// is waited for and discarded as a spare's (zygote.go starts it and says
// what it does beyond).

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/moves"
	"github.com/fluksio/fluksio-worker/platform"
)

// spareReadyTimeout bounds a spare's start: the interpreter, the runtime
// and the preloads (torch takes seconds on a cold page cache).
const spareReadyTimeout = 2 * time.Minute

// spare is one pre-started runner.
type spare struct {
	pool *warmPool
	we   *warmEnv
	box  *box // the call box made ahead: pid, cookie, cgroup, log
	cmd  *exec.Cmd

	stdin          io.WriteCloser
	stdout, stderr *os.File
	pipes          *nodePipes // the node's output pipes (embedded runtime only)
	dir            *callDir
	began          time.Time // when it was started, for freshness and age

	// started closes once its process runs and, for a spare forked from
	// a zygote, once it is ready or out of the pool: what discard waits
	// for before it stops it, and a call for a spare being forked.
	started chan struct{}
	exited  chan struct{} // closed once reaped; box holds its state
	exitErr error         // how it exited; set before exited closes
	// forked is a forked spare's process as the kernel sees it, which
	// knows it exited before its zygote reports it (nil for a spare the
	// worker started).
	forked *platform.ExitWatch

	// code is what its code came from, set once it is ready; released
	// (no longer held) once it serves a call or is discarded. Both are
	// guarded by pool.mu.
	code     *codeWatch
	released bool

	// state is where it is in its life; guarded by pool.mu, changed only
	// by move.
	state spareState
}

// spareState is where a spare (or a zygote) is in its life. Each is in
// the pool (starting or ready) until one move takes it out for good:
//
//	starting ──▶ ready ──▶ claimed ──▶ serving
//	    │          │          │
//	    ▼          ▼          ▼
//	 retired    retired    refused
//
// A call claims a ready spare (it is out of the pool, so nothing else can
// have it) and checks it outside the pool's lock: fresh, it serves the
// call, whose Process owns it from then on; stale or dead, it is refused
// and discarded. A spare retired (stale, dead, not wanted, the pool
// closed) is discarded. A zygote is never claimed: it forks spares while
// ready, until it is retired.
type spareState uint8

const (
	spareStarting spareState = iota // started or being forked, not ready yet
	spareReady                      // waiting in the pool for a call
	spareClaimed                    // taken out of the pool by a call, being checked
	spareServing                    // handed to a call (final: the call owns it)
	spareRefused                    // claimed, then found stale or dead (final: discarded)
	spareRetired                    // taken out of the pool unused (final: discarded)
)

// spareMoves is every legal move: from a state, the states it may go to.
var spareMoves = moves.Table[spareState]{
	spareStarting: {spareReady, spareRetired},
	spareReady:    {spareClaimed, spareRetired},
	spareClaimed:  {spareServing, spareRefused},
}

// move changes s's state to, a move its caller knows is legal (it holds
// the pool's mutex and saw the state it moves from). An illegal one is a
// bug in the pool, and loud (moves.Table.Must): a panic under test, an
// error in the log otherwise, where the worker goes on; it changes
// nothing.
func (s *spare) move(to spareState) {
	var log *slog.Logger
	if s.box != nil {
		log = s.box.log
	}
	spareMoves.Must(&s.state, to, "a spare runner", "the worker's warm pool", log)
}

// tryMove changes s's state to, where that is a legal move from its
// state, and reports whether it did: for a move that may lose to another
// (the spare retired meanwhile, or out of the pool already), whose false
// its caller expects and handles. The pool's mutex is held.
func (s *spare) tryMove(to spareState) bool { return spareMoves.Try(&s.state, to) }

// String names a state in the log and the tests' messages.
func (st spareState) String() string {
	switch st {
	case spareStarting:
		return "starting"
	case spareReady:
		return "ready"
	case spareClaimed:
		return "claimed"
	case spareServing:
		return "serving"
	case spareRefused:
		return "refused"
	case spareRetired:
		return "retired"
	}
	return "unknown"
}

// run starts the spare, waits for its report, and then for its end:
// handed a call, the call owns what follows; otherwise it is cleaned up.
func (s *spare) run() {
	report, err := s.start()
	if err != nil {
		s.startFailed(err)
		return
	}
	s.settle(s.awaitReport(report))
	s.waitServed()
}

// startFailed takes s, which could not start, out of the pool, and its
// environment with it: its calls start cold.
func (s *spare) startFailed(err error) {
	p := s.pool
	s.box.log.Warn("could not start a spare runner; calls of its environment start cold", "error", err)
	p.mu.Lock()
	p.retireLocked(s)
	p.forgetLocked(s.we)
	p.mu.Unlock()
	close(s.exited)
}

// awaitReport reaps s, started, once it exits, and reads its report.
func (s *spare) awaitReport(report *os.File) (spareReport, error) {
	go func() {
		s.exitErr = s.cmd.Wait()
		s.box.reaped(s.cmd)
		close(s.exited)
	}()
	// A runtime that does not know spare mode (an engine's older runner)
	// never reports: it is stopped, and counts as a spare that failed.
	notReady := time.AfterFunc(spareReadyTimeout, func() { s.box.signalAll(syscall.SIGKILL) })
	var r spareReport
	err := json.NewDecoder(report).Decode(&r)
	report.Close()
	notReady.Stop()
	return r, err
}

// settle makes s ready with the code its report says it came from, where
// it reported, is alive and is still in the pool, and reports whether it
// did.
func (s *spare) settle(r spareReport, decodeErr error) bool {
	p := s.pool
	var code *codeWatch
	if decodeErr == nil {
		code = p.changes.follow(r.paths(), s.began)
	}
	p.mu.Lock()
	for name, why := range r.Failed {
		if !p.reported[name] {
			p.reported[name] = true
			s.box.log.Warn("a --preload module could not be imported; spares go on without it", "module", name, "error", why)
		}
	}
	alive := decodeErr == nil && !closed(s.exited)
	kept := alive && s.tryMove(spareReady) // not if it was retired meanwhile
	if kept {
		s.code = code
		p.publishLocked()
	}
	p.mu.Unlock()
	if !kept && code != nil {
		p.changes.release(code)
	}
	if !alive {
		s.box.log.Debug("spare runner did not get ready", "error", decodeErr)
	}
	return kept
}

// runForked forks the spare from its environment's zygote z; a zygote
// that cannot fork is replaced, and the spare with it.
func (s *spare) runForked(z *zygote) {
	p := s.pool
	if err := z.fork(s, false); err != nil {
		s.box.log.Info("a zygote could not fork a spare; replacing it", "error", err)
		p.mu.Lock()
		p.retireLocked(s)
		p.dropLocked(z.spare)
		p.fillLocked()
		p.mu.Unlock()
		close(s.exited)
		return
	}
	p.mu.Lock()
	if s.state == spareStarting {
		// Its code is its zygote's: as fresh as the zygote, as old.
		s.code, s.began = z.code, z.began
		if !p.changes.hold(z.code) {
			// The zygote was discarded meanwhile: nothing follows its
			// code any more.
			s.code = &codeWatch{}
			s.code.markStale("its zygote was replaced")
			s.released = true
		}
		s.move(spareReady)
		p.publishLocked()
	}
	p.mu.Unlock()
	close(s.started) // ready, or out of the pool: a call waits no more
	s.waitServed()
}

// waitServed waits for a started spare's end: handed a call, the call
// owns what follows; otherwise it is cleaned up and replaced.
func (s *spare) waitServed() {
	p := s.pool
	<-s.exited
	p.mu.Lock()
	died := p.retireLocked(s) // while waiting: never handed a call, replaced
	if died {
		s.we.failures++
		limit := maxSpareFailures
		if s.we.rt.Embedded && forksHere(p.cfg.Sandbox) {
			// The forks and their zygote die together when something
			// kills them all (the OOM killer, a user): that is not a
			// broken interpreter.
			limit *= forkedSparesAhead + 2
		}
		if s.we.failures >= limit {
			s.box.log.Warn("spare runners of an environment keep dying before they serve a call; its calls start cold until one teaches it again", "spares", s.we.failures)
			p.forgetLocked(s.we)
		}
		p.fillLocked()
		p.publishLocked()
	}
	p.mu.Unlock()
	if died {
		s.box.log.Info("a spare runner died while waiting for a call; replacing it", "pid", s.box.pid, "status", exitStatus(s.exitErr))
		p.discard(s)
	}
}

// start starts the spare's process as a call's runner is started, with
// the descriptor it reports on; it returns that report's read end.
func (s *spare) start() (*os.File, error) {
	p := s.pool
	l := newLaunch(p.cfg, s.box.log)
	defer l.close() // all of it, where it did not start
	if err := l.stdio(true); err != nil {
		return nil, err
	}
	reportR, reportW, err := l.fromRunner()
	if err != nil {
		return nil, err
	}
	args := []string{p.cfg.script(s.we.rt), spareFlag, strconv.Itoa(spareReportFD)}
	extra := extraFiles(map[int]*os.File{spareReportFD: reportW})
	if s.we.rt.Embedded {
		if p.preload != "" {
			args = append(args, p.preload)
		}
		if args, extra, err = l.passNodePipes(args, extra); err != nil {
			return nil, err
		}
	}
	if err := s.launch(l, args, extra); err != nil {
		return nil, err
	}
	s.stdout, s.stderr, s.pipes = l.stdout, l.stderr, l.nodes
	l.handOver()
	close(s.started)
	return reportR, nil
}

// launch starts s's process (a spare's or a zygote's) with args and extra
// as its descriptors from 3 on, in a call directory and the box of its
// own; l has its stdio. s keeps the process, its stdin and its directory;
// the caller hands l over.
func (s *spare) launch(l *launch, args []string, extra []*os.File) error {
	p := s.pool
	if err := l.makeDir(); err != nil {
		return err
	}
	s.began = time.Now()
	env := p.cfg.env(s.we.env)
	zygote := s.box.role == platform.CgroupZygote
	if zygote {
		env = append(env, pinForksEnv+"="+pinForks())
	}
	cmd, err := l.exec(s.box, args, extra, effectiveEnv(env), zygote, s.we.rt.Path)
	if err != nil {
		return err
	}
	s.cmd, s.stdin, s.dir = cmd, l.stdin, l.dir
	return nil
}

// effectiveEnv is env with only the last entry of each name, in order.
func effectiveEnv(env []string) []string {
	last := map[string]int{}
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		last[name] = i
	}
	out := make([]string, 0, len(last))
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if last[name] == i {
			out = append(out, kv)
		}
	}
	return out
}

// discard stops a spare that will serve no call, and removes all of it.
// A spare still starting is waited for: it is stopped once it started.
func (p *warmPool) discard(s *spare) {
	select {
	case <-s.started:
	case <-s.exited: // it could not start: nothing of it remains
		if !closed(s.started) {
			return
		}
	}
	p.mu.Lock()
	s.releaseCodeLocked()
	p.mu.Unlock()
	// Nothing of a call ran in it: no grace is owed.
	s.box.killed = true
	s.box.signalAll(syscall.SIGKILL)
	<-s.exited
	// Killed by the worker (or dead already): nothing to report above debug.
	s.box.log.Debug("spare runner removed", "pid", s.box.pid)
	s.box.sweep()
	s.box.teardown()
	s.stdin.Close()
	s.stdout.Close()
	s.stderr.Close()
	s.pipes.close()
	if err := s.dir.remove(); err != nil {
		s.box.log.Warn("could not remove a spare runner's directory", "dir", s.dir.path, "error", err)
	}
}

// handTo gives the spare's process to a call: from now on the call's
// Process owns it as if it had started it. The call's box shares the
// spare's cookie and cgroup; exited closes once the spare is reaped, and
// the gone returned once it exited: for a spare forked from a zygote, as
// soon as the kernel says so (its pidfd), before the zygote reaped and
// reported it; for another, it is exited.
func (s *spare) handTo(log *slog.Logger, exited chan struct{}) (b *box, gone chan struct{}, stdin io.WriteCloser, stdout, stderr *os.File, pipes *nodePipes, dir *callDir) {
	b = &box{log: log, pid: s.box.pid, cookie: s.box.cookie, cg: s.box.cg, kept: s.box.kept, oom: s.box.oom, began: time.Now()}
	gone = exited
	var kernelSays <-chan struct{}
	if s.forked != nil {
		kernelSays = s.forked.Exited() // nil without a pidfd: never
	}
	if kernelSays != nil {
		gone = make(chan struct{})
	}
	go func() {
		if gone != exited {
			select {
			case <-kernelSays:
			case <-s.exited:
			}
			close(gone)
		}
		<-s.exited
		b.setExit(s.box.exitState())
		log.Debug("runner exited", "pid", b.pid)
		close(exited)
	}()
	return b, gone, s.stdin, s.stdout, s.stderr, s.pipes, s.dir
}
