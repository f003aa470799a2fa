package runner

import (
	"sync"

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
	if k == nil {
		return v, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.free); n > 0 {
		v, ok = k.free[n-1], true
		var zero T
		k.free[n-1] = zero
		k.free = k.free[:n-1]
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
type callCgroups struct{ kept[*platform.CallCgroup] }

// newCgroup is a call's cgroup, named for the call: an emptied one when
// the pool keeps one (it keeps the name of the call it was made for), else
// a new one.
func (k *callCgroups) newCgroup(name string) (*platform.CallCgroup, error) {
	if k != nil {
		if g, ok := k.take(); ok {
			return g, nil
		}
	}
	return cgroups.New(name)
}

// recycle keeps g for another call where its call left it empty and
// unchanged, else removes it once it is empty.
func (k *callCgroups) recycle(g *platform.CallCgroup, empty bool) error {
	if k != nil && empty && g.Reusable() {
		// A new value for the next call: what g's box still does with g
		// cannot reach it.
		g = g.Reuse()
		if k.put(g) {
			return nil
		}
	}
	return g.Remove(reapWait)
}

// close removes the cgroups kept, and keeps none after.
func (k *callCgroups) close() {
	if k == nil {
		return
	}
	for _, g := range k.kept.close() {
		g.Remove(reapWait)
	}
}
