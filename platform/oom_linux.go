package platform

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// OOMWatch tells whether the kernel's out-of-memory killer killed
// something in a runner's memory cgroups since the watch began: the only
// way to know a SIGKILL was the OOM killer's and not anyone else's.
type OOMWatch struct {
	counters []oomCounter
	before   []int64
	// The call's memory limit, and whether the OOM killer killed as its
	// cgroup reached it (calllimits_linux.go); limit 0: none.
	limit        int64
	limitReached func() bool
}

// oomCounter is one memory cgroup's count of OOM kills: its oom_kill line.
type oomCounter struct {
	name string   // memory.events (v2) or memory.oom_control (v1), by path
	f    *os.File // name kept open, or nil: read by path
}

func (c oomCounter) read() int64 {
	if c.f == nil {
		return keyedValue(c.name, "oom_kill")
	}
	var buf [512]byte
	n, _ := c.f.ReadAt(buf[:], 0)
	return keyedValueOf(buf[:n], "oom_kill")
}

// workerOOM are the counters of the worker's own memory cgroups, which
// every runner it starts shares unless it has a cgroup of its own: on
// hybrid hosts that keep the memory controller in cgroup v1, the v1 memory
// cgroup (no runner leaves it: nothing here moves processes in v1); and
// its cgroup v2 where the memory controller is enabled there. Learnt once,
// at the first runner's start (after SetupCgroups moved the worker into its
// leaf), and kept open: a call's watch then reads a file already open
// instead of its runner's /proc/PID/cgroup, the mounts and the counters'
// paths.
var workerOOM = sync.OnceValues(func() (v1, v2 *oomCounter) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			if mount, err := unifiedMount(); err == nil {
				v2 = openCounter(filepath.Join(mount, f[2], "memory.events"))
			}
		case hasController(f[1], "memory"):
			v1 = openCounter(filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.oom_control"))
		}
	}
	return v1, v2
})

// openCounter opens a counter file that exists, or returns nil.
func openCounter(name string) *oomCounter {
	f, err := os.Open(name)
	if err != nil {
		return nil
	}
	return &oomCounter{name: name, f: f}
}

// WatchOOM starts watching the memory cgroups of a runner this worker
// started, or a zygote it started forked: in its call's cgroup g, or, g
// nil, in the worker's own. It watches g's memory.events where the memory
// controller is enabled for the calls' cgroups, else the worker's own
// cgroup v2 counter (g nil), and the worker's v1 memory cgroup on hybrid
// hosts. It watches nothing where none of them exists.
func WatchOOM(g *CallCgroup) *OOMWatch {
	w := &OOMWatch{}
	v1, v2 := workerOOM()
	switch {
	case g != nil && g.memory:
		w.add(oomCounter{name: filepath.Join(g.dir, "memory.events")})
	case g == nil && v2 != nil:
		w.add(*v2)
	}
	if v1 != nil {
		w.add(*v1)
	}
	w.watchLimit(g)
	return w
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

func (w *OOMWatch) add(c oomCounter) {
	w.counters = append(w.counters, c)
	w.before = append(w.before, c.read())
}

// Killed reports whether a counter watched has grown: the OOM killer
// killed a process in one of the cgroups.
func (w *OOMWatch) Killed() bool {
	for i, c := range w.counters {
		if c.read() > w.before[i] {
			return true
		}
	}
	return false
}
