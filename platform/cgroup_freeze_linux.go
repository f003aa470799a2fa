package platform

import (
	"os"
	"path/filepath"
)

// Frozen cgroups. Node code that may write its call's cgroup (root, or a
// delegated worker's user) may write 1 to cgroup.freeze of any call's
// cgroup of the worker, its own or another's: a process in a frozen cgroup
// runs nothing until it is thawed, signals but SIGKILL wait, and a process
// started straight into one (CLONE_INTO_CGROUP) stops before it execs, its
// parent waiting in the clone. So a cgroup kept for a later call is checked
// when it is handed out (Unfit), the worker thaws a call's cgroup before it
// signals the call's processes (so that SIGTERM lets them clean up and
// answer), and a start into a cgroup is bounded by its caller.

// Frozen reports whether the cgroup is frozen (cgroup.events says so, by
// its own cgroup.freeze or an ancestor's) or being frozen: its
// cgroup.freeze says 1, and its processes stop at their next step, which
// on a loaded machine may be a while after the write.
func (g *CallCgroup) Frozen() bool {
	var buf [128]byte
	if keyedValueOf(g.read(g.events, "cgroup.events", buf[:]), "frozen") > 0 {
		return true
	}
	if g.handedOn.Load() {
		return false
	}
	b, _ := os.ReadFile(filepath.Join(g.dir, "cgroup.freeze"))
	return len(b) > 0 && b[0] == '1'
}

// Thaw writes 0 to cgroup.freeze, so that the processes in the cgroup run
// again and get the signals sent to them. A cgroup frozen by an ancestor
// stays frozen: only the ancestor's thaw ends it.
func (g *CallCgroup) Thaw() error {
	if g.handedOn.Load() {
		return nil
	}
	return os.WriteFile(filepath.Join(g.dir, "cgroup.freeze"), []byte("0"), 0)
}
