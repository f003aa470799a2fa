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
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// maxWarmEnvs is how many environments spares are kept for. Engines send
// a pipeline's calls with a handful of environments (a GPU mask per
// device, a thread count); the ones used longest ago lose their spares.
const maxWarmEnvs = 4

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
	// spareMode is, for each runtime file, whether it speaks spare mode,
	// asked once (speaksSpareMode); guarded by modesMu, not mu: it is
	// asked with mu let go.
	modesMu   sync.Mutex
	spareMode map[string]func() bool

	mu       sync.Mutex
	envs     []*warmEnv // most recently used first
	closed   bool
	spares   sync.WaitGroup // every spare's goroutines
	janitor  chan struct{}  // closed by close
	reported map[string]bool
	// threaded holds the environments (by key) whose preloads start
	// threads: their spares start cold, never forked from a zygote.
	threaded map[string]bool
}

// warmEnv is one environment's spares and demand.
type warmEnv struct {
	key      string
	rt       Runtime
	env      []string // the request's env, as a call of it has it
	spares   []*spare // starting and ready
	zyg      *zygote  // its zygote, starting or ready, where calls are forked
	running  int      // calls of this environment running now
	want     int      // the most that ran at once: spares to keep
	failures int      // spares that died without serving, in a row
	// cold: its runtime does not speak spare mode; it keeps no spares.
	cold bool
}

func newWarmPool(cfg *Config) *warmPool {
	n := cfg.Spares
	if n <= 0 {
		return nil
	}
	p := &warmPool{cfg: cfg, max: n, forkTimeout: forkTimeout, replaceDelay: replaceDelay, exitReportWait: exitReportWait,
		changes: systemChanges(), janitor: make(chan struct{}), reported: map[string]bool{},
		spareMode: map[string]func() bool{}, threaded: map[string]bool{}}
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
	spares := p.speaksSpareMode(rt)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, func() {}
	}
	we := p.learnLocked(p.keyLocked(rt, env), rt, env, spares)
	we.running++
	we.want = max(we.want, we.running)
	forked := false
	forking := we.zyg != nil && we.zyg.state == spareReady
	s = p.claimLocked(we)
	if s == nil {
		// No spare ready: one forked now still beats a cold start.
		s = p.forkForCallLocked(we)
		forked = s != nil
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

// claimLocked takes the oldest ready spare of we out of the pool, checks
// it and hands it out (serving), or returns nil. A stale or dead one is
// refused and discarded, and the next one tried; where none is ready but
// one is being forked from the zygote, it is waited for, up to
// callForkTimeout. The pool's mutex is held, and let go while a spare is
// checked or waited for.
func (p *warmPool) claimLocked(we *warmEnv) *spare {
	waitUntil := time.Now().Add(callForkTimeout)
	for {
		s := p.readyLocked(we)
		if s == nil {
			// A spare being forked is ready in a millisecond or two: wait
			// for it rather than start cold, but not beyond
			// callForkTimeout (a wedged zygote holds it up to forkTimeout).
			// (A forked spare's started closes once it is ready or out
			// of the pool: one closed here is no forked spare's.)
			f := p.forkingLocked(we)
			if f == nil || closed(f.started) || !time.Now().Before(waitUntil) {
				return nil
			}
			p.mu.Unlock()
			wait := time.NewTimer(time.Until(waitUntil))
			select {
			case <-f.started:
			case <-f.exited:
			case <-wait.C:
			}
			wait.Stop()
			p.mu.Lock()
			continue
		}
		// Taken out of the pool before it is checked, so that no other
		// call and not the janitor can have it meanwhile.
		s.move(spareClaimed)
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
			s.move(spareRefused)
			p.discardLater(s)
			continue
		}
		s.move(spareServing)
		s.releaseCodeLocked() // its call's code is what it has now
		we.failures = 0
		return s
	}
}

// forkForCallLocked forks a spare for a call of we from its ready zygote,
// or returns nil: no zygote ready, or it is busy forking a spare ahead
// (the call does not queue behind it). A zygote that is stale, dead or
// cannot fork is replaced. The pool's mutex is held, and let go while the
// zygote is checked and forks.
func (p *warmPool) forkForCallLocked(we *warmEnv) *spare {
	z := we.zyg
	if z == nil || z.state != spareReady {
		return nil
	}
	p.mu.Unlock()
	why := z.staleness()
	if why == "" && closed(z.exited) {
		why = "it died"
	}
	var s *spare
	if why == "" {
		// Never in the pool: it is forked for this call.
		s = &spare{pool: p, we: we, exited: make(chan struct{}), state: spareServing}
		s.box = &box{log: z.box.log, kept: p.cfg.cgroups}
		switch err := z.fork(s, true); {
		case errors.Is(err, errZygoteBusy):
			s = nil
		case err != nil:
			why, s = err.Error(), nil
		}
	}
	p.mu.Lock()
	if why != "" {
		z.box.log.Info("zygote not used; replacing it, and the call starts cold", "reason", why)
		p.dropLocked(z.spare)
	} else {
		we.failures = 0
	}
	return s
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

// learnLocked finds or adds the environment, and makes it the most recent;
// one added keeps spares if its runtime speaks spare mode.
func (p *warmPool) learnLocked(key string, rt Runtime, env []string, spares bool) *warmEnv {
	i := slices.IndexFunc(p.envs, func(we *warmEnv) bool { return we.key == key })
	var we *warmEnv
	if i >= 0 {
		we = p.envs[i]
		p.envs = slices.Delete(p.envs, i, i+1)
	} else {
		we = &warmEnv{key: key, rt: rt, env: slices.Clone(env), cold: !spares}
	}
	p.envs = slices.Insert(p.envs, 0, we)
	return we
}

// speaksSpareMode reports whether rt can be started as a spare: whether
// it says so when asked (askCapabilities), the worker's own runtime as
// any other. Each runtime file is asked once, at its first call, with the
// pool's mutex let go (calls of other runtimes go on meanwhile; those of
// this one wait for the answer), so that one which would never report is
// told apart at once, not after spareReadyTimeout, and its calls start
// cold.
func (p *warmPool) speaksSpareMode(rt Runtime) bool {
	p.modesMu.Lock()
	ask := p.spareMode[rt.Path]
	if ask == nil {
		ask = sync.OnceValue(func() bool {
			c, err := askCapabilities(p.cfg, rt)
			if err == nil && c.speaks(spareFlag) {
				p.cfg.Log.Debug("the runner script speaks spare mode", "runtime", rt.Path, "version", c.Version, "modes", c.Modes)
				return true
			}
			if err == nil {
				err = fmt.Errorf("it speaks %q only", c.Modes)
			}
			p.cfg.Log.Warn("the runner script does not know spare mode; its calls start cold, without spares",
				"runtime", rt.Path, "error", err)
			return false
		})
		p.spareMode[rt.Path] = ask
	}
	p.modesMu.Unlock()
	return ask()
}

// forkingLocked is a spare of we being forked from its zygote, or nil.
func (p *warmPool) forkingLocked(we *warmEnv) *spare {
	if z := we.zyg; z == nil || z.state != spareReady {
		return nil
	}
	for _, s := range we.spares {
		if s.state == spareStarting {
			return s
		}
	}
	return nil
}

// countReadyLocked counts the ready spares of we.
func (p *warmPool) countReadyLocked(we *warmEnv) int {
	n := 0
	for _, s := range we.spares {
		if s.state == spareReady {
			n++
		}
	}
	return n
}

// readyLocked is the oldest ready spare of we, or nil.
func (p *warmPool) readyLocked(we *warmEnv) *spare {
	for _, s := range we.spares {
		if s.state == spareReady {
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
		if i >= maxWarmEnvs || we.cold {
			allowed = 0
		}
		left -= allowed
		waiting := false // for the zygote to be ready, to fork spares
		keep := allowed
		if we.rt.Embedded && forksHere(p.cfg.Sandbox) && !p.threaded[we.key] {
			// None ahead for an environment that gets none.
			if allowed > 0 {
				keep = allowed + forkedSparesAhead
			}
			// A zygote forks the environment's spares. One of the few
			// environments kept stays while other environments have the
			// spares (it is no runner): its next call is forked from it,
			// not started cold, and it is not started again (an
			// interpreter, and its code cache compiled, each time an
			// environment that ran more calls at once came first).
			waiting = we.zyg == nil || we.zyg.state != spareReady
			if (i >= maxWarmEnvs || we.cold) && we.zyg != nil {
				z := we.zyg.spare
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
	if p.retireLocked(s) {
		p.discardLater(s)
	}
}

// retireLocked takes s, starting or ready, out of the pool for good, and
// reports whether it did; its caller discards it. One out already
// (claimed by a call, or retired) stays as it is.
func (p *warmPool) retireLocked(s *spare) bool {
	if s.we.zyg != nil && s.we.zyg.spare == s {
		s.we.zyg = nil
	}
	s.we.spares = slices.DeleteFunc(s.we.spares, func(x *spare) bool { return x == s })
	return s.tryMove(spareRetired)
}

func (p *warmPool) publishLocked() {
	n := 0
	for _, we := range p.envs {
		for _, s := range we.spares { // a zygote is not a runner
			if s.state == spareReady {
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
	return append(slices.Clip(we.spares), we.zyg.spare)
}

// startLocked adds a starting spare (or zygote) to we; its goroutine
// starts it.
func (p *warmPool) startLocked(we *warmEnv, asZygote bool) {
	s := &spare{pool: p, we: we, started: make(chan struct{}), exited: make(chan struct{})}
	s.box = &box{log: p.cfg.Log.With("spare_of", "warm"), kept: p.cfg.cgroups, role: platform.CgroupSpare}
	run := s.run
	if asZygote {
		s.box.role = platform.CgroupZygote
		z := &zygote{spare: s}
		we.zyg = z
		run = z.run
	} else {
		we.spares = append(we.spares, s)
		if z := we.zyg; z != nil && z.state == spareReady {
			// Forked from its zygote, now that one is ready.
			run = func() { s.runForked(z) }
		}
	}
	p.spares.Add(1)
	go func() {
		defer p.spares.Done()
		run()
	}()
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

// discardLater discards s off the caller's path; close waits for it. The
// pool's mutex is held, and s's own goroutine still counts in p.spares.
func (p *warmPool) discardLater(s *spare) {
	p.spares.Add(1)
	go func() {
		defer p.spares.Done()
		p.discard(s)
	}()
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
