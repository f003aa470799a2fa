package runner

// Warm runners (--warm, --preload): spare runner processes started before
// their call exists, so a call does not wait for the interpreter to start
// and the runtime (and the preloads) to load.
//
// A spare is a whole call box made ahead: its own call directory, cookie
// and cgroup, and the exact environment its call will get. It serves one
// call and exits, like a runner started cold, so nothing passes from one
// call to the next. Spares are keyed by that environment less the per-call
// values (the call directory, the cookie), and by the runtime file: a call
// whose environment matches no ready spare starts cold, as with --warm 0,
// and teaches the pool that environment. The pool keeps spares for the
// few environments used last, as many for each as its calls ran at once
// (at least one), --warm in all.
//
// A spare is not handed a call when code it loaded, or a directory it
// would import from, changed after it started (it would run older code
// than a cold start), nor when it is older than spareMaxAge; it is stopped
// and the call starts cold. Spares are not calls: hello, status and
// --max-idle never see them. They are kept while the engine is
// unreachable (a reconnection then finds them ready) and stopped when the
// worker stops, drains, exits idle or reloads.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// spareFlag starts the runtime in spare mode (the embedded runtime's
// SPARE_FLAG, agent/runtime):
// `RUNTIME --fluksio-spare FD [MOD,MOD]`.
const spareFlag = "--fluksio-spare"

// maxWarmEnvs is how many environments spares are kept for. Engines send
// a pipeline's calls with a handful of environments (a GPU mask per
// device, a thread count); the ones used longest ago lose their spares.
const maxWarmEnvs = 4

// spareMaxAge retires a spare that waited this long, and starts another:
// what the freshness check cannot see (a changed file the interpreter read
// at start outside sys.path, a system clock step) is never older than this.
const spareMaxAge = 10 * time.Minute

// spareCheckInterval is how often waiting spares are checked for age,
// freshness and death, so a stale spare is replaced before a call finds it.
const spareCheckInterval = 5 * time.Second

// changeSlack covers the file system's clock: a file's change time comes
// from the kernel's coarse clock, which may be up to a tick (at most 10 ms)
// behind the time the worker read when it started the spare. A change that
// close to a spare's start marks it stale, at worst one cold start more.
const changeSlack = 20 * time.Millisecond

// spareReadyTimeout bounds a spare's start: the interpreter, the runtime
// and the preloads (torch takes seconds on a cold page cache).
const spareReadyTimeout = 2 * time.Minute

// replaceDelay is how long a call handed a spare runs before the spare's
// replacement starts, if it has not ended by then: most short calls have.
// A replacement made beside a short call takes the CPU the call answers
// with: an interpreter start, and even a fork from a zygote (which put 2
// to 3 ms on a trivial call's answer on two loaded cores).
const replaceDelay = 10 * time.Millisecond

// forkedSparesAhead is how many spares an environment forked from a zygote
// keeps beyond one for each of its calls that ran at once: a forked spare
// costs little memory of its own (its pages are the zygote's until
// written), and with one more a call that comes back to back finds one
// ready even while the last one's replacement is being forked.
const forkedSparesAhead = 1

// maxSpareFailures is how many spares of one environment may die without
// serving a call before the pool forgets the environment (a broken
// interpreter must not be restarted in a loop); its next call teaches it
// again.
const maxSpareFailures = 3

// warmPool owns the spares. Its mutex guards everything below it.
type warmPool struct {
	cfg     *Config
	max     int
	preload string // comma-joined --preload, for the embedded runtime only
	// forkTimeout is the const, but for tests that keep a fork in flight;
	// replaceDelay too, for tests that watch a call's spare replaced, and
	// exitReportWait, for tests that keep a zygote stopped.
	forkTimeout    time.Duration
	replaceDelay   time.Duration
	exitReportWait time.Duration
	// changes follows what warm runners' code came from (fresh.go): the
	// process's watcher, or one without notifications in a test.
	changes *changeWatcher

	mu       sync.Mutex
	envs     []*warmEnv // most recently used first
	closed   bool
	spares   sync.WaitGroup // every spare's goroutines
	janitor  chan struct{}  // closed by close
	reported map[string]bool
}

// warmEnv is one environment's spares and demand.
type warmEnv struct {
	key      string
	rt       Runtime
	env      []string // the request's env, as a call of it has it
	spares   []*spare // starting and ready
	zyg      *spare   // its zygote, starting or ready, where calls are forked
	running  int      // calls of this environment running now
	want     int      // the most that ran at once: spares to keep
	failures int      // spares that died without serving, in a row
}

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

	started chan struct{} // closed once started
	readied chan struct{} // closed once ready (a spare ahead of its call)
	exited  chan struct{} // closed once reaped; box holds its state
	exitErr error         // how it exited; set before exited closes
	// forked is a forked spare's process as the kernel sees it, which
	// knows it exited before its zygote reports it (nil for a spare the
	// worker started).
	forked *platform.ExitWatch
	zyg    *zygoteOf // set for a zygote, which forks calls and serves none

	// code is what its code came from, set (under pool.mu) once it is
	// ready; released once it serves a call or is discarded.
	code     *codeWatch
	released atomic.Bool

	// Guarded by pool.mu.
	ready   bool
	taken   bool
	retired bool
}

func newWarmPool(cfg *Config) *warmPool {
	n := cfg.Spares
	if n <= 0 {
		return nil
	}
	p := &warmPool{cfg: cfg, max: n, forkTimeout: forkTimeout, replaceDelay: replaceDelay, exitReportWait: exitReportWait,
		changes: systemChanges(), janitor: make(chan struct{}), reported: map[string]bool{}}
	if len(cfg.Preload) > 0 {
		p.preload = strings.Join(cfg.Preload, ",")
	}
	go p.watch()
	return p
}

// envKey identifies the environment a call's runner gets: the runtime
// and the environment entries in effect (the last of each name wins, as
// in exec), sorted, so the order of the request's env keys does not matter.
func envKey(rtPath string, env []string) string {
	effective := map[string]string{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		effective[name] = kv
	}
	entries := make([]string, 0, len(effective))
	for _, kv := range effective {
		entries = append(entries, kv)
	}
	slices.Sort(entries)
	return rtPath + "\x00" + strings.Join(entries, "\x00")
}

// take hands out a ready, fresh spare for a call of env on rt, or nil: the
// call starts cold. Either way the pool learns the environment and starts
// replacements in the background. done is called when the call ends.
func (p *warmPool) take(rt Runtime, env []string) (s *spare, done func()) {
	if p == nil {
		return nil, func() {}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, func() {}
	}
	we := p.learnLocked(p.keyLocked(rt, env), rt, env)
	we.running++
	we.want = max(we.want, we.running)
	forked := false
	forking := we.zyg != nil && we.zyg.ready && !we.zyg.retired
	waitUntil := time.Now().Add(callForkTimeout)
	for s == nil {
		s = p.readyLocked(we)
		if s == nil {
			// A spare being forked is ready in a millisecond or two: wait
			// for it rather than start cold, but not beyond
			// callForkTimeout (a wedged zygote holds it up to forkTimeout).
			f := p.forkingLocked(we)
			if f == nil || !time.Now().Before(waitUntil) {
				break
			}
			p.mu.Unlock()
			wait := time.NewTimer(time.Until(waitUntil))
			select {
			case <-f.readied:
			case <-f.exited:
			case <-wait.C:
			}
			wait.Stop()
			p.mu.Lock()
			continue
		}
		// Taken out of the pool before it is checked, so that no other
		// call and not the janitor can have it meanwhile.
		s.taken = true
		we.spares = slices.DeleteFunc(we.spares, func(x *spare) bool { return x == s })
		p.mu.Unlock()
		why := s.staleness()
		if why == "" && (closed(s.exited) || s.forked.HasExited()) {
			why = "it died" // a dead spare is never handed a call
		}
		if why == "" && s.box.cg != nil && s.box.cg.Frozen() {
			why = "its cgroup is frozen (cgroup.freeze; node code can write it)"
		}
		p.mu.Lock()
		if why != "" {
			s.box.log.Debug("spare runner not used; stopping it", "reason", why)
			s.retired = true
			p.discardLater(s)
			s = nil
			continue
		}
		s.releaseCode() // its call's code is what it has now
		we.failures = 0
	}
	// No spare ready: one forked now still beats a cold start.
	if z := we.zyg; s == nil && z != nil && z.ready && !z.retired {
		p.mu.Unlock()
		why := z.staleness()
		if why == "" && closed(z.exited) {
			why = "it died"
		}
		if why == "" {
			s = &spare{pool: p, we: we, started: make(chan struct{}), exited: make(chan struct{})}
			s.box = &box{log: z.box.log, kept: p.cfg.cgroups}
			switch err := z.fork(s, true); {
			case errors.Is(err, errZygoteBusy):
				s = nil
			case err != nil:
				why, s = err.Error(), nil
			default:
				forked = true
			}
		}
		p.mu.Lock()
		if why != "" {
			z.box.log.Info("zygote not used; replacing it, and the call starts cold", "reason", why)
			p.dropLocked(z)
		} else {
			we.failures = 0
		}
	}
	// A spare is replaced at once where none was ready, or where the
	// forked spares left no longer cover the environment's calls at once
	// (calls come back to back: the zygote forks one at a time, and a
	// replacement forked late leaves the next call none). Otherwise its
	// replacement waits for the call (replaceDelay).
	short := forking && p.countReadyLocked(we) < we.want
	if s == nil || forked || short {
		p.fillLocked()
	}
	p.publishLocked()
	p.mu.Unlock()
	if s == nil {
		p.cfg.Metrics.WarmMiss()
		return nil, func() { p.ended(we) }
	}
	p.cfg.Metrics.WarmHit()
	if forked || short {
		return s, func() { p.ended(we) }
	}
	// The replacement starts once the call ended or replaceDelay after
	// it started, whichever comes first (see replaceDelay). An environment
	// forked from a zygote keeps a spare ahead meanwhile, so a call that
	// comes back to back still finds one ready.
	replace := time.AfterFunc(p.replaceDelay, func() {
		p.mu.Lock()
		p.fillLocked()
		p.mu.Unlock()
	})
	return s, func() {
		replace.Stop()
		p.ended(we)
	}
}

// ended counts a call of we out, and starts the spares now wanted.
func (p *warmPool) ended(we *warmEnv) {
	p.mu.Lock()
	we.running--
	p.fillLocked()
	p.mu.Unlock()
}

// keyLocked is the environment key of a call of env on rt: a known
// environment's, learned from a call with the same request env, else made
// (which copies, sorts and joins the worker's whole environment: the most
// a warm call allocated).
func (p *warmPool) keyLocked(rt Runtime, env []string) string {
	for _, we := range p.envs {
		if we.rt.Path == rt.Path && slices.Equal(we.env, env) {
			return we.key
		}
	}
	return envKey(rt.Path, p.cfg.env(env))
}

// learnLocked finds or adds the environment, and makes it the most recent.
func (p *warmPool) learnLocked(key string, rt Runtime, env []string) *warmEnv {
	i := slices.IndexFunc(p.envs, func(we *warmEnv) bool { return we.key == key })
	var we *warmEnv
	if i >= 0 {
		we = p.envs[i]
		p.envs = slices.Delete(p.envs, i, i+1)
	} else {
		we = &warmEnv{key: key, rt: rt, env: slices.Clone(env)}
	}
	p.envs = slices.Insert(p.envs, 0, we)
	return we
}

// forkingLocked is a spare of we being forked from its zygote, or nil.
func (p *warmPool) forkingLocked(we *warmEnv) *spare {
	if z := we.zyg; z == nil || !z.ready || z.retired {
		return nil
	}
	for _, s := range we.spares {
		if !s.ready && !s.retired {
			return s
		}
	}
	return nil
}

// countReadyLocked counts the ready spares of we.
func (p *warmPool) countReadyLocked(we *warmEnv) int {
	n := 0
	for _, s := range we.spares {
		if s.ready && !s.retired {
			n++
		}
	}
	return n
}

// readyLocked is the oldest ready spare of we, or nil.
func (p *warmPool) readyLocked(we *warmEnv) *spare {
	for _, s := range we.spares {
		if s.ready && !s.retired {
			return s
		}
	}
	return nil
}

// fillLocked starts the spares the environments want and stops those they
// no longer get: environments in order of use, each as many as ran at
// once, --warm in all, at most maxWarmEnvs environments.
func (p *warmPool) fillLocked() {
	if p.closed {
		return
	}
	left := p.max
	for i, we := range p.envs {
		allowed := min(max(we.want, 1), left)
		if i >= maxWarmEnvs {
			allowed = 0
		}
		left -= allowed
		waiting := false // for the zygote to be ready, to fork spares
		keep := allowed
		if we.rt.Embedded && forksHere() {
			keep = allowed + forkedSparesAhead
			// A zygote forks the environment's spares.
			waiting = we.zyg == nil || !we.zyg.ready
			if allowed == 0 && we.zyg != nil {
				z := we.zyg
				p.retireLocked(z)
				p.discardLater(z)
			}
			if allowed > 0 && we.zyg == nil {
				p.startLocked(we, true)
			}
		}
		for len(we.spares) > keep {
			s := we.spares[len(we.spares)-1]
			p.retireLocked(s)
			p.discardLater(s)
		}
		for len(we.spares) < keep && !waiting {
			p.startLocked(we, false)
		}
	}
	// Environments past the few kept are forgotten once idle.
	kept := p.envs[:0]
	for i, we := range p.envs {
		if i < maxWarmEnvs || len(we.spares) > 0 || we.running > 0 {
			kept = append(kept, we)
		}
	}
	clear(p.envs[len(kept):])
	p.envs = kept
}

// dropLocked takes s out of the pool and discards it, unless it is out
// already.
func (p *warmPool) dropLocked(s *spare) {
	if !s.retired {
		p.retireLocked(s)
		p.discardLater(s)
	}
}

// retireLocked takes s out of the pool; its caller discards it.
func (p *warmPool) retireLocked(s *spare) {
	s.retired = true
	if s.we.zyg == s {
		s.we.zyg = nil
	}
	s.we.spares = slices.DeleteFunc(s.we.spares, func(x *spare) bool { return x == s })
}

func (p *warmPool) publishLocked() {
	n := 0
	for _, we := range p.envs {
		for _, s := range we.spares { // a zygote is not a runner
			if s.ready {
				n++
			}
		}
	}
	p.cfg.Metrics.SetWarmRunners(n)
}

// ownLocked is every warm process of we: its spares and its zygote.
func (we *warmEnv) ownLocked() []*spare {
	if we.zyg == nil {
		return we.spares
	}
	return append(slices.Clip(we.spares), we.zyg)
}

// startLocked adds a starting spare (or zygote) to we; its goroutine
// starts it.
func (p *warmPool) startLocked(we *warmEnv, zygote bool) {
	s := &spare{pool: p, we: we, started: make(chan struct{}), exited: make(chan struct{}), readied: make(chan struct{})}
	s.box = &box{log: p.cfg.Log.With("spare_of", "warm"), kept: p.cfg.cgroups}
	var from *spare // the zygote it is forked from, when one is ready
	if zygote {
		s.zyg = &zygoteOf{}
		we.zyg = s
	} else {
		we.spares = append(we.spares, s)
		if z := we.zyg; z != nil && z.ready && !z.retired {
			from = z
		}
	}
	p.spares.Add(1)
	go func() {
		defer p.spares.Done()
		if from != nil {
			s.runForked(from)
			return
		}
		s.run()
	}()
}

// run starts the spare, waits for its report, and then for its end:
// handed a call, the call owns what follows; otherwise it is cleaned up.
func (s *spare) run() {
	p := s.pool
	report, err := s.start()
	if err != nil {
		s.box.log.Warn("could not start a spare runner; calls of its environment start cold", "error", err)
		p.mu.Lock()
		p.retireLocked(s)
		p.forgetLocked(s.we)
		p.mu.Unlock()
		close(s.exited)
		return
	}
	go func() {
		s.exitErr = s.cmd.Wait()
		s.box.reaped(s.cmd)
		close(s.exited)
	}()
	// A runtime that does not know spare mode (an engine's older runner)
	// never reports: it is stopped, and counts as a spare that failed.
	notReady := time.AfterFunc(spareReadyTimeout, func() { s.box.signalAll(syscall.SIGKILL) })
	var r struct {
		Watch  [][2]any          `json:"watch"`
		Failed map[string]string `json:"failed"`
	}
	decodeErr := json.NewDecoder(report).Decode(&r)
	report.Close()
	notReady.Stop()
	paths := make([]reportedPath, 0, len(r.Watch))
	for _, w := range r.Watch {
		path, _ := w[0].(string)
		existed, _ := w[1].(bool)
		paths = append(paths, reportedPath{path, existed})
	}
	var code *codeWatch
	if decodeErr == nil {
		code = p.changes.follow(paths, s.began)
	}
	p.mu.Lock()
	for name, why := range r.Failed {
		if !p.reported[name] {
			p.reported[name] = true
			s.box.log.Warn("a --preload module could not be imported; spares go on without it", "module", name, "error", why)
		}
	}
	alive := decodeErr == nil && !closed(s.exited)
	kept := alive && !s.retired
	if kept {
		s.ready, s.code = true, code
		close(s.readied)
		if s.zyg != nil {
			p.fillLocked() // its spares are forked now
		}
		p.publishLocked()
	}
	p.mu.Unlock()
	if !kept && code != nil {
		p.changes.release(code)
	}
	if !alive {
		s.box.log.Debug("spare runner did not get ready", "error", decodeErr)
	}
	s.waitServed()
}

// runForked forks the spare from its environment's zygote z; a zygote
// that cannot fork is replaced, and the spare with it.
func (s *spare) runForked(z *spare) {
	p := s.pool
	if err := z.fork(s, false); err != nil {
		s.box.log.Info("a zygote could not fork a spare; replacing it", "error", err)
		p.mu.Lock()
		p.retireLocked(s)
		p.dropLocked(z)
		p.fillLocked()
		p.mu.Unlock()
		close(s.exited)
		return
	}
	p.mu.Lock()
	if !s.retired {
		// Its code is its zygote's: as fresh as the zygote, as old.
		s.ready, s.code, s.began = true, z.code, z.began
		if !p.changes.hold(z.code) {
			// The zygote was discarded meanwhile: nothing follows its
			// code any more.
			s.code = &codeWatch{}
			s.code.markStale("its zygote was replaced")
			s.released.Store(true)
		}
		close(s.readied)
		p.publishLocked()
	}
	p.mu.Unlock()
	s.waitServed()
}

// waitServed waits for a started spare's end: handed a call, the call
// owns what follows; otherwise it is cleaned up and replaced.
func (s *spare) waitServed() {
	p := s.pool
	<-s.exited
	p.mu.Lock()
	taken, retired := s.taken, s.retired
	if !taken && !retired {
		// It died while waiting: never handed a call, replaced.
		p.retireLocked(s)
		s.we.failures++
		limit := maxSpareFailures
		if s.we.rt.Embedded && forksHere() {
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
	if !taken && !retired {
		s.box.log.Info("a spare runner died while waiting for a call; replacing it", "pid", s.box.pid, "status", exitStatus(s.exitErr))
		p.discard(s)
	}
}

// forgetLocked drops an environment and its spares' places.
func (p *warmPool) forgetLocked(we *warmEnv) {
	for _, s := range slices.Clone(we.ownLocked()) {
		p.retireLocked(s)
		p.discardLater(s)
	}
	we.failures = 0
	p.envs = slices.DeleteFunc(p.envs, func(x *warmEnv) bool { return x == we })
}

// start starts the spare's process as a call's runner is started, with
// the descriptor it reports on; it returns that report's read end.
func (s *spare) start() (*os.File, error) {
	p := s.pool
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	stdoutR, stdoutW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the runner's pipes: %w", err)
	}
	stderrR, stderrW, err := pipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("creating the runner's pipes: %w", err)
	}
	reportR, reportW, err := pipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("creating the runner's pipes: %w", err)
	}
	dir, err := p.cfg.newCallDir()
	if err != nil {
		closeAll()
		return nil, err
	}
	args := []string{s.we.rt.Path, spareFlag, "3"}
	extra := []*os.File{reportW}
	var pipes *nodePipes
	var ctlChild, exitsR, exitsW *os.File
	if s.zyg != nil {
		// A zygote's own output goes nowhere: no call reads it.
		stdoutW.Close()
		stderrW.Close()
		stdoutW, stderrW = nil, nil
		if exitsR, exitsW, err = pipe(); err != nil {
			closeAll()
			dir.remove()
			return nil, fmt.Errorf("creating the runner's pipes: %w", err)
		}
		if s.zyg.ctl, ctlChild, err = controlPair(); err != nil {
			closeAll()
			dir.remove()
			return nil, err
		}
		files = append(files, ctlChild)
		args = []string{s.we.rt.Path, zygoteFlag, "3", "4", "5"}
		if p.preload != "" {
			args = append(args, p.preload)
		}
		extra = append(extra, ctlChild, exitsW)
	} else if s.we.rt.Embedded {
		if p.preload != "" {
			args = append(args, p.preload)
		}
		if pipes, err = newNodePipes(); err != nil {
			closeAll()
			dir.remove()
			return nil, err
		}
		args, extra = pipes.pass(args, extra)
	}
	cmd := exec.Command(p.cfg.Python, args...)
	s.box.prepare(cmd, dir.env(effectiveEnv(p.cfg.env(s.we.env)), p.cfg.CancelGrace))
	cmd.Dir = dir.cwd
	if s.zyg == nil {
		cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	}
	cmd.ExtraFiles = extra
	stdin, err := cmd.StdinPipe()
	s.began = time.Now()
	if err == nil {
		err = s.box.start(cmd)
	}
	if s.zyg != nil {
		ctlChild.Close()
		exitsW.Close()
	} else {
		stdoutW.Close()
		stderrW.Close()
	}
	reportW.Close()
	pipes.started()
	if err != nil {
		if s.zyg != nil {
			s.closeControl()
			exitsR.Close()
		}
		stdoutR.Close()
		stderrR.Close()
		reportR.Close()
		pipes.close()
		dir.remove()
		return nil, fmt.Errorf("starting %s: %w", p.cfg.Python, err)
	}
	s.cmd, s.stdin, s.stdout, s.stderr, s.pipes, s.dir = cmd, stdin, stdoutR, stderrR, pipes, dir
	if s.zyg != nil {
		s.zyg.exits = newRunnerExits(exitsR)
	}
	close(s.started)
	return reportR, nil
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

// staleness says why s must not serve a call, or "".
func (s *spare) staleness() string {
	if time.Since(s.began) > spareMaxAge {
		return "older than its maximum age"
	}
	if s.code == nil {
		return ""
	}
	return s.code.staleness(s.pool.changes)
}

// releaseCode stops following s's code, once.
func (s *spare) releaseCode() {
	if s.code != nil && s.released.CompareAndSwap(false, true) {
		s.pool.changes.release(s.code)
	}
}

// discardLater discards s off the caller's path; close waits for it. The
// pool's mutex is held, and s's own goroutine still counts in p.spares.
func (p *warmPool) discardLater(s *spare) {
	p.spares.Add(1)
	go func() {
		defer p.spares.Done()
		p.discard(s)
	}()
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
	s.releaseCode()
	// Nothing of a call ran in it: no grace is owed.
	s.box.killed = true
	s.box.signalAll(syscall.SIGKILL)
	if s.zyg != nil {
		// After the kill: a fork in flight holds the zygote's lock until
		// it is answered, and a wedged zygote answers only by its end.
		s.closeControl() // the zygote serves no fork after this
	}
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

// watch retires spares that are too old, stale or dead, and replaces them.
func (p *warmPool) watch() {
	tick := time.NewTicker(spareCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.janitor:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		var ready []*spare
		for _, we := range p.envs {
			for _, s := range we.ownLocked() {
				if s.ready {
					ready = append(ready, s)
				}
			}
		}
		p.mu.Unlock()
		var gone []*spare
		for _, s := range ready {
			if why := s.staleness(); why != "" {
				s.box.log.Debug("spare runner retired", "reason", why)
				gone = append(gone, s)
			}
		}
		if len(gone) == 0 {
			continue
		}
		p.mu.Lock()
		for _, s := range gone {
			if !s.taken && !s.retired {
				p.retireLocked(s)
				p.discardLater(s)
			}
		}
		p.fillLocked()
		p.publishLocked()
		p.mu.Unlock()
	}
}

// close stops every spare and waits until all of them are gone. The pool
// starts none after it.
func (p *warmPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.spares.Wait()
		return
	}
	p.closed = true
	close(p.janitor)
	var all []*spare
	for _, we := range p.envs {
		for _, s := range slices.Clone(we.ownLocked()) {
			p.retireLocked(s)
			all = append(all, s)
		}
	}
	p.envs = nil
	p.publishLocked()
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.discard(s)
		}()
	}
	wg.Wait()
	p.spares.Wait()
}

// handTo gives the spare's process to a call: from now on the call's
// Process owns it as if it had started it. The call's box shares the
// spare's cookie and cgroup; exited closes once the spare is reaped.
func (s *spare) handTo(log *slog.Logger, exited chan struct{}) (b *box, stdin io.WriteCloser, stdout, stderr *os.File, pipes *nodePipes, dir *callDir) {
	b = &box{log: log, pid: s.box.pid, cookie: s.box.cookie, cg: s.box.cg, kept: s.box.kept, oom: s.box.oom, began: time.Now()}
	go func() {
		<-s.exited
		b.setExit(s.box.exitState())
		log.Debug("runner exited", "pid", b.pid)
		close(exited)
	}()
	return b, s.stdin, s.stdout, s.stderr, s.pipes, s.dir
}
