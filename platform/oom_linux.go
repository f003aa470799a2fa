package platform

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OOMWatch tells whether the kernel's out-of-memory killer killed
// something in a process's memory cgroups since the watch began: the only
// way to know a SIGKILL was the OOM killer's and not anyone else's.
type OOMWatch struct {
	files  []string // counters: memory.events (v2) or memory.oom_control (v1)
	before []int64
}

// WatchOOM starts watching the memory cgroups pid is in: its cgroup v2
// where the memory controller is enabled (memory.events' oom_kill), and,
// on hybrid hosts that keep the memory controller in cgroup v1, its v1
// memory cgroup (memory.oom_control's oom_kill). It watches nothing where
// neither exists.
func WatchOOM(pid int) *OOMWatch {
	w := &OOMWatch{}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return w
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
				w.add(filepath.Join(mount, f[2], "memory.events"))
			}
		case hasController(f[1], "memory"):
			w.add(filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.oom_control"))
		}
	}
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

func (w *OOMWatch) add(file string) {
	if _, err := os.Stat(file); err != nil {
		return
	}
	w.files = append(w.files, file)
	w.before = append(w.before, keyedValue(file, "oom_kill"))
}

// Killed reports whether a counter watched has grown: the OOM killer
// killed a process in one of the cgroups.
func (w *OOMWatch) Killed() bool {
	for i, file := range w.files {
		if keyedValue(file, "oom_kill") > w.before[i] {
			return true
		}
	}
	return false
}
