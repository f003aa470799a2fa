package agent

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/platform"
)

// cookieEnv carries a call's cookie in its runner's environment, and so in
// everything the node starts: at the end of the call every process of this
// user carrying it is stopped, even one that left the process group.
const cookieEnv = "FLUKSIO_CALL_COOKIE"

// nodeOOMScoreAdj raises node processes' oom_score_adj (-1000..1000), so
// that when memory runs out the kernel kills node code, not the worker
// that would answer for it.
const nodeOOMScoreAdj = 500

// reapWait bounds how long the end of a call waits for processes it killed
// to become zombies, so they can be reaped.
const reapWait = time.Second

// containment is what the worker found it can do to keep a call's
// processes together, said in the log, status and inventory; cgroups is
// where calls' cgroups are made, in cgroup mode. Both are the process's:
// a subreaper and a cgroup are properties of the whole worker.
var (
	containment = platform.ContainProcessGroup
	cgroups     *platform.CallCgroups
)

// SetupContainment prepares this process to contain calls as --containment
// asks (auto: a cgroup per call where it may, else the subreaper and the
// cookie) and returns the mode in use. On Linux it always becomes a child
// subreaper, which reaps what a call leaves in either mode.
func SetupContainment(log *slog.Logger, want string) string {
	mode, err := platform.SetupContainment()
	if err != nil {
		log.Warn("could not become a child subreaper; a process that leaves its call's process group may outlive the call", "error", err)
	}
	if want != "subreaper" {
		cc, err := platform.SetupCgroups()
		switch {
		case err == nil:
			cgroups, mode = cc, platform.ContainCgroup
			if !cc.CloneInto() {
				log.Info("this system does not let a process start straight into a cgroup (clone3 is denied); each runner is moved into its call's cgroup as it starts")
			}
		case want == "cgroup":
			log.Warn("--containment cgroup: this worker cannot make cgroups (it needs root, or a unit with Delegate=yes)", "using", mode, "error", err)
		default:
			log.Debug("no cgroup per call", "error", err)
		}
	}
	containment = mode
	if mode != platform.ContainProcessGroup {
		go reapAdopted()
	}
	return mode
}

// reapInterval is how often the worker, as subreaper, reaps orphans it
// adopted outside the end of a call: one that exits after its call's
// sweep gave up waiting (a loaded machine), or after the last call.
const reapInterval = time.Second

// reapAdopted runs for the life of the process, which is what owns the
// subreaper role. A look with nothing to reap is one waitid system call.
func reapAdopted() {
	for range time.Tick(reapInterval) {
		platform.ReapOrphans()
	}
}

// ProbeContainment says which mode `run` would use here, for inventory
// and check.
func ProbeContainment(want string) string {
	mode, _ := platform.SetupContainment()
	if want != "subreaper" && mode != platform.ContainProcessGroup && platform.ProbeCgroups() == nil {
		return platform.ContainCgroup
	}
	return mode
}

// callBox holds what contains one call beyond its process group: its
// cookie, the escaped processes found carrying it, and what the runner
// cost.
type callBox struct {
	cookie  string
	began   time.Time
	mu      sync.Mutex
	cg      *platform.CallCgroup // the call's cgroup, in cgroup mode
	escaped map[int]struct{}     // cookie carriers outside the group, signalled
	found   bool                 // anything of the call was ever signalled
	state   *os.ProcessState     // the runner's, once reaped
	// What the call's cgroup said it cost, read before it is removed.
	cgCPU  time.Duration
	cgPeak int64
}

// prepare gives the call its cookie and the runner's environment.
func (c *call) prepare(cmd *exec.Cmd, env []string) {
	var b [16]byte
	rand.Read(b[:])
	c.box.cookie = hex.EncodeToString(b[:])
	c.box.began = time.Now()
	// env may share its array with the agent's base environment.
	cmd.Env = append(slices.Clip(env), cookieEnv+"="+c.box.cookie)
	if cgroups != nil {
		g, err := cgroups.New(c.box.cookie[:16])
		if err != nil {
			c.log.Warn("could not make the call's cgroup; it is contained by its process group and cookie", "error", err)
			return
		}
		c.box.cg = g
		g.Prepare(cmd)
	}
}

// startRunner starts the runner, registered so that reaping orphans leaves
// it to os/exec, and raises its oom_score_adj.
func (c *call) startRunner(cmd *exec.Cmd) error {
	if err := platform.StartContained(cmd); err != nil {
		if c.box.cg != nil {
			c.box.cg.Remove(0)
			c.box.cg = nil
		}
		return err
	}
	if c.box.cg != nil {
		if err := c.box.cg.Started(cmd.Process.Pid); err != nil {
			// The cookie finds what the cgroup would have held.
			c.log.Warn("could not move the runner into the call's cgroup; it is contained by its process group and cookie", "cgroup", c.box.cg.Dir(), "error", err)
			c.box.cg.Remove(0)
			c.box.cg = nil
		}
	}
	if err := platform.RaiseOOMScore(cmd.Process.Pid, nodeOOMScoreAdj); err != nil {
		c.log.Debug("could not raise the runner's oom_score_adj", "error", err)
	}
	return nil
}

// reaped records the runner's end; os/exec has waited for it.
func (c *call) reaped(cmd *exec.Cmd) {
	c.box.mu.Lock()
	c.box.state = cmd.ProcessState
	c.box.mu.Unlock()
	platform.Forget(cmd.Process.Pid)
}

// signalAll sends sig to the call's process group and to every process
// outside it in the call's cgroup or, without one, carrying the call's
// cookie. It reports whether anything was there to signal.
func (c *call) signalAll(sig syscall.Signal) bool {
	found := platform.SignalGroup(c.pid, sig)
	if c.box.cg != nil {
		// Nothing leaves a cgroup it cannot write: no cookie to look for.
		if c.box.cg.Signal(sig, c.pid) {
			found = true
		}
		if found {
			c.box.mu.Lock()
			c.box.found = true
			c.box.mu.Unlock()
		}
		return found
	}
	if c.box.cookie == "" {
		return found
	}
	for _, pid := range platform.FindCookie(cookieEnv, c.box.cookie, c.pid) {
		c.box.mu.Lock()
		if c.box.escaped == nil {
			c.box.escaped = map[int]struct{}{}
		}
		c.box.escaped[pid] = struct{}{}
		c.box.mu.Unlock()
		if syscall.Kill(pid, sig) == nil {
			found = true
		}
	}
	if found {
		c.box.mu.Lock()
		c.box.found = true
		c.box.mu.Unlock()
	}
	return found
}

// anyAlive reports whether the group or an escaped process signalled so
// far is still running. It reaps adopted orphans first: a zombie this
// worker adopted still counts as a member of its process group.
func (c *call) anyAlive() bool {
	platform.ReapOrphans()
	if platform.GroupAlive(c.pid) {
		return true
	}
	if c.box.cg != nil {
		return c.box.cg.Populated()
	}
	c.box.mu.Lock()
	defer c.box.mu.Unlock()
	for pid := range c.box.escaped {
		if platform.ProcessAlive(pid) {
			return true
		}
	}
	return false
}

// sweep runs once the group is stopped: it kills whatever still carries
// the cookie (started while the group was stopping), waits for what it
// killed to exit, and reaps the orphans this worker adopted.
func (c *call) sweep() {
	if g := c.box.cg; g != nil {
		if g.Populated() {
			c.log.Warn("processes of the call were still running after it was stopped; killing its cgroup")
			g.Kill()
		}
		c.box.cgCPU, c.box.cgPeak = g.CPU(), g.PeakMemory()
		if err := g.Remove(reapWait); err != nil {
			c.log.Warn("could not remove the call's cgroup", "cgroup", g.Dir(), "error", err)
		}
		platform.ReapOrphans()
		return
	}
	c.box.mu.Lock()
	found := c.box.found
	c.box.mu.Unlock()
	if c.box.cookie == "" || !found {
		// Nothing was left to stop: nothing could have started since.
		// Orphans that exited by themselves may still wait to be reaped.
		platform.ReapOrphans()
		return
	}
	settle := func() {
		deadline := time.Now().Add(reapWait)
		for c.anyAlive() && time.Now().Before(deadline) {
			time.Sleep(stopPoll)
		}
	}
	settle() // what stopGroup killed may take a moment to exit
	if c.signalAll(syscall.SIGKILL) {
		c.log.Warn("processes of the call were still running after it was stopped; killed them")
		settle()
	}
}

// deathMessage says why a runner ended without answering, when the worker
// did not stop it: the signal that killed it, or its exit code.
func (c *call) deathMessage() string {
	select {
	case <-c.exited:
	case <-time.After(reapWait):
		return protocol.MsgNodeStopped
	}
	c.box.mu.Lock()
	state := c.box.state
	c.box.mu.Unlock()
	if state == nil {
		return protocol.MsgNodeStopped
	}
	ws, ok := state.Sys().(syscall.WaitStatus)
	switch {
	case !ok:
		return protocol.MsgNodeStopped
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && c.box.cg != nil && c.box.cg.OOMKills() > 0:
		return "the node process was killed by SIGKILL: the kernel's out-of-memory killer stopped it (its cgroup's memory.events counts an OOM kill), so the node needs more memory than it may use here"
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		return "the node process was killed by SIGKILL; the kernel's out-of-memory killer does this when memory runs out, so the node may need more memory than this machine had free"
	case ws.Signaled():
		return fmt.Sprintf("the node process was killed by %s", unix.SignalName(ws.Signal()))
	case ws.Exited() && ws.ExitStatus() != 0:
		return fmt.Sprintf("the node process exited with code %d without answering", ws.ExitStatus())
	}
	return protocol.MsgNodeStopped
}

// callUsage is what a call cost: wall time from start to the end of its
// last process, CPU time and peak memory: of every process of the call
// from its cgroup, else of the runner (and the children it waited for).
type callUsage struct {
	Wall        time.Duration
	CPU         time.Duration
	PeakRSSByte int64
}

func (c *call) usage() callUsage {
	u := callUsage{Wall: time.Since(c.box.began)}
	c.box.mu.Lock()
	state := c.box.state
	c.box.mu.Unlock()
	if state != nil {
		u.CPU = state.UserTime() + state.SystemTime()
		if ru, ok := state.SysUsage().(*syscall.Rusage); ok {
			u.PeakRSSByte = platform.MaxRSSBytes(int64(ru.Maxrss))
		}
	}
	if c.box.cgCPU > 0 {
		u.CPU = c.box.cgCPU
	}
	if c.box.cgPeak > 0 {
		u.PeakRSSByte = c.box.cgPeak
	}
	return u
}

// logEnd writes the call's end record, with what it cost.
func (c *call) logEnd() {
	u := c.usage()
	c.log.Info("call ended", "wall_s", u.Wall.Seconds(), "cpu_s", u.CPU.Seconds(),
		"peak_rss_mb", u.PeakRSSByte>>20, "containment", containment)
}
