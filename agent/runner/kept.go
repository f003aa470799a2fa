package runner

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// kept holds what a pool's calls emptied after them for later calls (call
// directories, calls' cgroups): at most keptPerPool, none once closed.
type kept[T any] struct {
	mu     sync.Mutex
	free   []T
	closed bool
}

// keptPerPool bounds what is kept of each kind: as many as calls run at
// once, in practice.
const keptPerPool = 16

// take hands out one kept, if there is one.
func (k *kept[T]) take() (v T, ok bool) {
	return k.takeIf(func(T) bool { return true })
}

// takeIf hands out the one kept last of those fit says fit, if there is one.
func (k *kept[T]) takeIf(fit func(T) bool) (v T, ok bool) {
	if k == nil {
		return v, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.free) - 1; i >= 0; i-- {
		if fit(k.free[i]) {
			v, ok = k.free[i], true
			k.free = slices.Delete(k.free, i, i+1)
			break
		}
	}
	return v, ok
}

// put keeps v, and reports false where it is not kept (closed, or full):
// the caller then removes it.
func (k *kept[T]) put(v T) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || len(k.free) >= keptPerPool {
		return false
	}
	k.free = append(k.free, v)
	return true
}

// close keeps nothing from now on and returns what was kept, to remove.
func (k *kept[T]) close() []T {
	k.mu.Lock()
	defer k.mu.Unlock()
	free := k.free
	k.free, k.closed = nil, true
	return free
}

// callCgroups keeps calls' cgroups found empty and unchanged after their
// call for later calls of the pool (platform.CallCgroup.Reusable says
// which): making and removing one per call cost about a sixth of the
// worker's CPU dispatching short calls. Pool.Close removes them, and so
// does the next worker's start after a worker killed outright (the names
// are those of the calls' cgroups).
//
// Node code that may write its own cgroup may write those kept too, while
// they wait (they are its call's cgroup's siblings): freeze one, so that a
// runner started into it stops before it execs; change a limit; or move a
// process of its own into one, out of its call's reach. So a kept cgroup
// is checked again when it is handed out, all are whenever a call ends
// (the end of the call whose process moved is one), and Pool.Close kills
// what is in them: one found unfit is killed and removed, never used.
type callCgroups struct {
	kept[*platform.CallCgroup]
	log *slog.Logger
	// startWithin bounds a runner's start straight into its cgroup
	// (box.startInto): cgroupStartTimeout, shorter in tests.
	startWithin time.Duration
	// discarding counts the unfit cgroups being killed and removed, off
	// the path of the call that found them.
	discarding sync.WaitGroup
}

// cgroupStartTimeout bounds a runner's start straight into its call's
// cgroup: a clone and an exec, milliseconds even on a loaded machine. One
// into a frozen cgroup never ends by itself (see box.startInto).
const cgroupStartTimeout = 10 * time.Second

func newCallCgroups(log *slog.Logger) *callCgroups {
	return &callCgroups{log: log, startWithin: cgroupStartTimeout}
}

// newCgroup is a cgroup for a runner of role (a call's, a spare's, a
// zygote's), named for it: an emptied one made for the same role when the
// pool keeps one fit for it (it keeps the name it was made with), else a
// new one. A kept one is checked as it is handed out: one unfit is
// discarded.
func (k *callCgroups) newCgroup(role platform.CgroupRole, name string) (*platform.CallCgroup, error) {
	for k != nil {
		g, ok := k.takeIf(func(g *platform.CallCgroup) bool { return g.Role() == role })
		if !ok {
			break
		}
		if why := g.Unfit(); why != "" {
			k.discard(g, why)
			continue
		}
		return g, nil
	}
	return callCgroupsSet().NewFor(role, name)
}

// recycle keeps g for another call where its call left it empty and
// unchanged, else removes it once it is empty. The cgroups kept are
// checked first (sweep).
func (k *callCgroups) recycle(g *platform.CallCgroup, empty bool) error {
	if k != nil {
		k.sweep()
		if empty && g.Reusable() {
			// A new value for the next call: what g's box still does with g
			// cannot reach it.
			g = g.Reuse()
			if k.put(g) {
				return nil
			}
		}
	}
	return g.Remove(reapWait)
}

// sweep discards the kept cgroups no longer fit for a call.
func (k *callCgroups) sweep() {
	var unfit []*platform.CallCgroup
	var why []string
	k.mu.Lock()
	k.free = slices.DeleteFunc(k.free, func(g *platform.CallCgroup) bool {
		if w := g.Unfit(); w != "" {
			unfit, why = append(unfit, g), append(why, w)
			return true
		}
		return false
	})
	k.mu.Unlock()
	for i, g := range unfit {
		k.discard(g, why[i])
	}
}

// discard kills what is in g, a cgroup found unfit for a call, and removes
// it, in the background (close waits for it).
func (k *callCgroups) discard(g *platform.CallCgroup, why string) {
	k.log.Warn("a call's cgroup was changed before its call could use it (node code of another call can write it); killing what is in it and removing it", "cgroup", g.Dir(), "reason", why)
	k.discarding.Add(1)
	go func() {
		defer k.discarding.Done()
		g.Kill()
		if err := g.Remove(reapWait); err != nil {
			k.log.Warn("could not remove a call's cgroup", "cgroup", g.Dir(), "error", err)
		}
	}()
}

// close removes the cgroups kept, killing what moved into them, and keeps
// none after.
func (k *callCgroups) close() {
	if k == nil {
		return
	}
	for _, g := range k.kept.close() {
		if g.Populated() {
			k.log.Warn("a process moved into a call's cgroup while it waited for a call; killing it", "cgroup", g.Dir())
			g.Kill()
		}
		g.Remove(reapWait)
	}
	k.discarding.Wait()
}
