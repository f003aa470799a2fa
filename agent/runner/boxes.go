package runner

// Boxes made ahead: a runner started cold (--warm 0, or a call that finds
// no spare) needs a box, its cookie, its cgroup and its call directory,
// made before it starts. They are made ahead of the call, off its path, as
// their removal goes on behind it (Process.End): each cold start takes a
// box made ahead, when there is one, and has the next one made in the
// background. So the pool holds as many as cold starts ran at once, and a
// worker that never starts a runner cold holds none. Nothing runs in a
// box made ahead: an empty cgroup and an empty directory of the state
// directory's calls/, which Pool.Close removes and ClearLeftovers would
// after a worker killed outright.

import (
	"log/slog"
	"slices"
	"sync"
)

// boxesAhead owns the boxes made ahead; its mutex guards what follows it.
type boxesAhead struct {
	cfg    *Config
	behind *sync.WaitGroup // the pool's work in the background

	mu     sync.Mutex
	ready  []madeBox
	closed bool
}

type madeBox struct {
	box *box
	dir *callDir
}

// take hands out a box and its call directory for a cold start, made ahead
// when one is ready, else now; and has another made in the background.
func (a *boxesAhead) take(log *slog.Logger) (*box, *callDir, error) {
	a.mu.Lock()
	var m madeBox
	if n := len(a.ready); n > 0 {
		m = a.ready[n-1]
		a.ready[n-1] = madeBox{}
		a.ready = a.ready[:n-1]
	}
	if !a.closed {
		a.behind.Go(a.makeOne)
	}
	a.mu.Unlock()
	if m.box != nil {
		m.box.log = log
		return m.box, m.dir, nil
	}
	dir, err := a.cfg.newCallDir()
	if err != nil {
		return nil, nil, err
	}
	return &box{log: log, kept: a.cfg.cgroups}, dir, nil
}

// makeOne makes a box ahead. One that cannot be made is not: the cold
// start that finds none makes its own, and says what failed.
func (a *boxesAhead) makeOne() {
	dir, err := a.cfg.newCallDir()
	if err != nil {
		return
	}
	b := &box{log: a.cfg.Log, kept: a.cfg.cgroups}
	b.makeAhead()
	a.mu.Lock()
	if !a.closed {
		a.ready = append(a.ready, madeBox{box: b, dir: dir})
		b = nil
	}
	a.mu.Unlock()
	if b != nil {
		discardBox(madeBox{box: b, dir: dir})
	}
}

// close makes no more boxes; discard removes those made, once the ones
// being made are (the pool's behind is waited for in between).
func (a *boxesAhead) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
}

func (a *boxesAhead) discard() {
	a.mu.Lock()
	ready := a.ready
	a.ready = nil
	a.mu.Unlock()
	for _, m := range ready {
		discardBox(m)
	}
}

// sweep discards the boxes made ahead whose cgroup may no longer take a
// runner: node code of a call may freeze it, or move a process into it,
// out of its call's reach. Every call's end sweeps (the end of the call
// whose process moved is one).
func (a *boxesAhead) sweep() {
	var unfit []madeBox
	a.mu.Lock()
	a.ready = slices.DeleteFunc(a.ready, func(m madeBox) bool {
		if m.box.cg != nil && m.box.cg.Unusable() != "" {
			unfit = append(unfit, m)
			return true
		}
		return false
	})
	a.mu.Unlock()
	for _, m := range unfit {
		discardBox(m)
	}
}

// discardBox removes a box nothing ran in; what node code moved into its
// cgroup is killed.
func discardBox(m madeBox) {
	if g := m.box.cg; g != nil {
		if why := g.Unusable(); why != "" {
			m.box.cg = nil
			m.box.kept.discard(g, why)
		}
	}
	m.box.teardown()
	if err := m.dir.remove(); err != nil {
		m.box.log.Warn("could not remove a call directory made ahead", "dir", m.dir.path, "error", err)
	}
}
