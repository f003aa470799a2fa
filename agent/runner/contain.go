package runner

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/logging"
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

// cgroups is where calls' cgroups are made, in cgroup mode. It is the
// process's: a subreaper and a cgroup are properties of the whole worker,
// and the mode is said once, when the worker starts.
var cgroupsSet atomic.Pointer[platform.CallCgroups]

// callCgroupsSet is the calls' cgroups SetupContainment made; nil where
// calls are not contained by cgroup. Atomic: a test may set containment
// up while workers of other tests run in the same process.
func callCgroupsSet() *platform.CallCgroups { return cgroupsSet.Load() }

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
			cgroupsSet.Store(cc)
			mode = platform.ContainCgroup
			if !cc.CloneInto() {
				log.Info("this system does not let a process start straight into a cgroup (clone3 is denied); each runner is moved into its call's cgroup as it starts")
			}
			for _, left := range cc.LeftAlone() {
				log.Warn("left a cgroup that may be a gone worker's: " + left)
			}
		case want == "cgroup":
			log.Warn("--containment cgroup: this worker cannot make cgroups (it needs root, or a unit with Delegate=yes)", "using", mode, "error", err)
		default:
			log.Debug("no cgroup per call", "error", err)
		}
	}
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

// box holds what contains one runner beyond its process group: its
// cookie, its cgroup, the escaped processes found carrying the cookie, and
// what the runner cost.
type box struct {
	log    *slog.Logger
	pid    int // the group's leader; set once started
	cookie string
	began  time.Time
	cg     *platform.CallCgroup // the call's cgroup, in cgroup mode
	kept   *callCgroups         // the pool's emptied cgroups: where cg comes from and goes back to
	role   platform.CgroupRole  // what its runner is made for (a call, a spare, a zygote): its cgroup's name
	oom    *platform.OOMWatch   // the runner's memory cgroups; set once started

	mu      sync.Mutex
	escaped map[int]struct{} // cookie carriers outside the group, signalled
	found   bool             // anything of the call was ever signalled
	exit    *runnerExit      // the runner's, once reaped
	// What the call's cgroup said it cost, read before it is removed.
	cgCPU  time.Duration
	cgPeak int64
	// killed: the worker killed everything of it on purpose (a spare
	// stopped at shutdown), so what the sweep still finds is expected,
	// not a node that outlived its call.
	killed bool
	// empty: the sweep found the call's cgroup empty; nothing of the call
	// runs, or ever will again.
	empty bool
}

// emptied reports whether the sweep found the call's cgroup empty: then,
// and only then, nothing of the call can touch its directory again (a
// process without the cookie that left its group could, without one).
func (b *box) emptied() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.empty
}

// leftover says the sweep found processes still running: a warning about
// a call's node, a debug line about a spare the worker killed itself.
func (b *box) leftover(msg string, args ...any) {
	if b.killed {
		b.log.Debug(msg, args...)
		return
	}
	b.log.Warn(msg, args...)
}

// prepare gives the box its cookie and the runner its environment.
func (b *box) prepare(cmd *exec.Cmd, env []string) {
	cmd.Env = b.make(env)
	if b.cg != nil {
		b.cg.Prepare(cmd)
	}
}

// make gives the box its cookie and, in cgroup mode, its cgroup, unless
// it has them (made ahead); it returns the runner's environment: env and
// the cookie.
func (b *box) make(env []string) []string {
	if b.cookie == "" {
		b.makeAhead()
	}
	b.began = time.Now()
	// env may share its array with the worker's base environment.
	return append(slices.Clip(env), cookieEnv+"="+b.cookie)
}

// makeAhead gives the box its cookie and, in cgroup mode, its cgroup.
func (b *box) makeAhead() {
	var r [16]byte
	rand.Read(r[:])
	b.cookie = hex.EncodeToString(r[:])
	if callCgroupsSet() != nil {
		g, err := b.kept.newCgroup(b.role, b.cookie[:16])
		if err != nil {
			b.log.Warn("could not make the call's cgroup; it is contained by its process group and cookie", "error", err)
		} else {
			b.cg = g
		}
	}
}

// start starts the runner in its own process group, registered so that
// reaping orphans leaves it to os/exec, and raises its oom_score_adj.
func (b *box) start(cmd *exec.Cmd) error {
	if b.cg == nil && callCgroupsSet().Limited() {
		return errNoLimitedCgroup
	}
	platform.NewProcessGroup(cmd)
	if b.cg != nil {
		if err := b.refit(cmd); err != nil {
			return err
		}
	}
	if err := b.startInto(cmd); err != nil {
		if b.cg != nil {
			b.cg.Remove(0)
			b.cg = nil
		}
		return err
	}
	if b.cg != nil {
		if err := b.cg.Started(cmd.Process.Pid); err != nil {
			// The cookie finds what the cgroup would have held.
			b.log.Warn("could not move the runner into the call's cgroup; it is contained by its process group and cookie", "cgroup", b.cg.Dir(), "error", err)
			b.cg.Remove(0)
			b.cg = nil
		} else if err := b.frozenIn(); err != nil {
			cmd.Wait()
			platform.Forget(cmd.Process.Pid)
			return err
		}
	}
	b.oom = platform.WatchOOM(b.cg) // in its call's cgroup, or the worker's
	if err := platform.RaiseOOMScore(cmd.Process.Pid, nodeOOMScoreAdj); err != nil {
		b.log.Debug("could not raise the runner's oom_score_adj", "error", err)
	}
	b.pid = cmd.Process.Pid
	return nil
}

// refit replaces the box's cgroup, made or kept ahead of the start, where
// it may no longer take the runner (Unusable): node code of another call
// may have frozen it or moved a process into it meanwhile. The
// replacement is named by the cookie's other half: the cgroup replaced may
// be one made for this box, still being removed. Where no other can be
// made, the start fails.
func (b *box) refit(cmd *exec.Cmd) error {
	why := b.cg.Unusable()
	if why == "" {
		return nil
	}
	g := b.cg
	b.cg = nil
	b.kept.discard(g, why)
	next, err := b.kept.newCgroup(b.role, b.cookie[16:])
	if err != nil {
		return fmt.Errorf("the call's cgroup %s could not take the runner (%s), and no other could be made: %w", g.Dir(), why, err)
	}
	b.cg = next
	next.Prepare(cmd)
	return nil
}

// startKillInterval is how often a start past its bound kills what is in
// its cgroup again, until the clone returns.
const startKillInterval = 100 * time.Millisecond

// startInto starts cmd, straight into the box's cgroup where runners are
// started so, within the pool's startWithin. A process started into a
// frozen cgroup (node code of another call can freeze it after it was
// checked) stops before it execs, and its parent waits in the clone for
// the exec, holding the lock every start of this process takes: past the
// bound, everything in the cgroup is killed, which ends the clone, and the
// start fails, the cgroup discarded. The kill is repeated until the start
// returns: one that came before the clone put the new process in the
// cgroup (a loaded machine) killed nothing.
func (b *box) startInto(cmd *exec.Cmd) error {
	if b.cg == nil || !callCgroupsSet().CloneInto() {
		return platform.StartContained(cmd)
	}
	returned := make(chan struct{})
	var late atomic.Bool
	var killing sync.WaitGroup
	killing.Add(1)
	bound := time.AfterFunc(b.kept.startWithin, func() {
		defer killing.Done()
		late.Store(true)
		for {
			b.cg.Kill()
			select {
			case <-returned:
				return
			case <-time.After(startKillInterval):
			}
		}
	})
	err := platform.StartContained(cmd)
	close(returned)
	if bound.Stop() {
		killing.Done() // it never ran
	}
	killing.Wait()
	if !late.Load() {
		return err
	}
	if err == nil {
		cmd.Wait()
		platform.Forget(cmd.Process.Pid)
	}
	why := "it did not start"
	if b.cg.Frozen() {
		why = "its cgroup is frozen (cgroup.freeze; node code of another call can write it)"
	}
	g := b.cg
	b.cg = nil
	b.kept.discard(g, why)
	return fmt.Errorf("the runner did not start within %s in its call's cgroup %s: %s; it was killed and the cgroup removed, and the call may be sent again", b.kept.startWithin, g.Dir(), why)
}

// frozenIn fails the start of a runner just moved into the box's cgroup
// where the cgroup is frozen: the runner would wait, frozen, for its call.
// It kills the runner and discards the cgroup; the caller waits for the
// runner.
func (b *box) frozenIn() error {
	if !b.cg.Frozen() {
		return nil
	}
	g := b.cg
	b.cg = nil
	g.Kill()
	b.kept.discard(g, "it is frozen (cgroup.freeze)")
	return fmt.Errorf("the call's cgroup %s was frozen as the runner moved into it (node code of another call can write it); the runner was killed and the cgroup removed, and the call may be sent again", g.Dir())
}

// reaped records the runner's end; os/exec has waited for it.
func (b *box) reaped(cmd *exec.Cmd) {
	b.setExit(exitOf(cmd.ProcessState))
	platform.Forget(cmd.Process.Pid)
}

// setExit records how the runner ended.
func (b *box) setExit(e *runnerExit) {
	b.mu.Lock()
	b.exit = e
	b.mu.Unlock()
}

// exitState is how the runner ended once it was reaped, else nil.
func (b *box) exitState() *runnerExit {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.exit
}

// runnerExit is how a runner ended: its wait status, and what it cost as
// its parent learnt when it reaped it. A runner forked from a zygote is the
// zygote's child: the zygote reaps it and reports its status and peak
// memory (its call's cgroup counts its CPU); lost: not even that is known.
type runnerExit struct {
	status  syscall.WaitStatus
	cpu     time.Duration // user and system; 0 where the zygote reaped it
	peakRSS int64         // bytes; 0 where not known
	lost    bool          // its zygote reaped it, and died before it reported how it ended
}

// exitOf is what os/exec found when it waited for a runner.
func exitOf(ps *os.ProcessState) *runnerExit {
	if ps == nil {
		return nil // it was never waited for
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	ru, _ := ps.SysUsage().(*syscall.Rusage)
	return exitOfRusage(ws, ru)
}

// exitOfRusage is what wait4 found when the worker waited for a runner.
func exitOfRusage(ws syscall.WaitStatus, ru *syscall.Rusage) *runnerExit {
	e := &runnerExit{status: ws}
	if ru != nil {
		e.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		e.peakRSS = platform.MaxRSSBytes(int64(ru.Maxrss))
	}
	return e
}

// err is nil for a runner that exited 0, else says how it ended, as
// os/exec's ExitError does ("exit status 7", "signal: killed").
func (e *runnerExit) err() error {
	switch ws := e.status; {
	case e.lost:
		return errors.New("its exit status is unknown")
	case ws.Signaled():
		return errors.New("signal: " + ws.Signal().String())
	case ws.ExitStatus() != 0:
		return fmt.Errorf("exit status %d", ws.ExitStatus())
	}
	return nil
}

// signalAll sends sig to the process group and to every process outside
// it in the call's cgroup or, without one, carrying the call's cookie. It
// reports whether anything was there to signal.
func (b *box) signalAll(sig syscall.Signal) bool {
	found := platform.SignalGroup(b.pid, sig)
	switch {
	case b.cg != nil:
		// A frozen process gets no signal but SIGKILL until it is thawed:
		// node code may have frozen its own call's cgroup.
		if b.cg.Frozen() {
			b.cg.Thaw()
		}
		// Nothing leaves a cgroup it cannot write: no cookie to look for.
		found = b.cg.Signal(sig, b.pid) || found
	case b.cookie != "":
		for _, pid := range platform.FindCookie(cookieEnv, b.cookie, b.pid) {
			b.mu.Lock()
			if b.escaped == nil {
				b.escaped = map[int]struct{}{}
			}
			b.escaped[pid] = struct{}{}
			b.mu.Unlock()
			if syscall.Kill(pid, sig) == nil {
				found = true
			}
		}
	}
	if found {
		b.mu.Lock()
		b.found = true
		b.mu.Unlock()
	}
	return found
}

// anyAlive reports whether the group or an escaped process signalled so
// far is still running. It reaps adopted orphans first: a zombie this
// worker adopted still counts as a member of its process group.
func (b *box) anyAlive() bool {
	platform.ReapOrphans()
	if platform.GroupAlive(b.pid) {
		return true
	}
	if b.cg != nil {
		return b.cg.Populated()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for pid := range b.escaped {
		if platform.ProcessAlive(pid) {
			return true
		}
	}
	return false
}

// sweep runs once the group is stopped: it kills whatever is still there
// (started while the group was stopping) and waits for what it killed to
// exit; without a cgroup it also reaps the orphans this worker adopted.
// With a cgroup it then reads what the call cost, before teardown removes
// the cgroup.
func (b *box) sweep() {
	if g := b.cg; g != nil {
		empty := !g.Populated()
		if !empty {
			b.leftover("processes of the call were still running after it was stopped; killing its cgroup")
			g.Kill()
			if empty = g.WaitEmpty(reapWait); !empty {
				b.log.Warn("processes of the call's cgroup did not exit after SIGKILL", "cgroup", g.Dir(), "waited", reapWait.String())
			}
		}
		b.cgCPU, b.cgPeak = g.CPU(), g.PeakMemory()
		b.mu.Lock()
		b.empty = empty
		b.mu.Unlock()
		// No reaping here: an exited process leaves its cgroup at once, so
		// the cgroup says it is empty before its orphans are reaped, and
		// a look for them at every call's end (the runners of other calls,
		// zombies for a moment until os/exec reaps them, made it a read of
		// the worker's threads' children lists at most ends) is left to
		// the reaper that runs every reapInterval, and to teardown's
		// retries where the kernel still holds the cgroup.
		return
	}
	b.mu.Lock()
	found := b.found
	b.mu.Unlock()
	if b.cookie == "" || !found {
		// Nothing was left to stop: nothing could have started since.
		// Orphans that exited by themselves may still wait to be reaped.
		platform.ReapOrphans()
		return
	}
	settle := func() {
		deadline := time.Now().Add(reapWait)
		for b.anyAlive() && time.Now().Before(deadline) {
			time.Sleep(stopPoll)
		}
	}
	settle() // what the stop ladder killed may take a moment to exit
	if b.signalAll(syscall.SIGKILL) {
		b.leftover("processes of the call were still running after it was stopped; killed them")
		settle()
	}
}

// teardown keeps the call's cgroup for a later call where sweep found it
// empty and nothing of the call changed it, else removes it: the kernel
// refuses the removal (EBUSY) until it let go of the exited processes,
// which takes from nothing to tens of milliseconds, so it is retried;
// nothing of the call runs meanwhile.
func (b *box) teardown() {
	g := b.cg
	if g == nil {
		return
	}
	if err := b.kept.recycle(g, b.emptied()); err != nil {
		b.log.Warn("could not remove the call's cgroup", "cgroup", g.Dir(), "error", err)
	}
}

// deathMessage says why a runner ended without answering, when the worker
// did not stop it. It begins with the protocol's "the node process
// stopped", which engines written for the reference agent may match on,
// and goes on with the cause: the signal that killed it, or its exit code.
func (b *box) deathMessage(exited <-chan struct{}) string {
	if why := b.deathCause(exited); why != "" {
		return protocol.MsgNodeStopped + ": " + why
	}
	return protocol.MsgNodeStopped
}

func (b *box) deathCause(exited <-chan struct{}) string {
	select {
	case <-exited:
	case <-time.After(reapWait):
		return ""
	}
	state := b.exitState()
	if state == nil {
		return ""
	}
	ws := state.status
	switch {
	case state.lost:
		return "it ended, but how is unknown: the zygote it was forked from reaped it and died before it could report its exit status"
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && b.oom != nil && b.oom.CallLimit() > 0:
		return "killed by SIGKILL from the kernel's out-of-memory killer: the call reached its own memory limit of " +
			logging.FormatBytes(b.oom.CallLimit()) + " (--call-memory-max, set by this worker's owner); the node needs more memory than that limit allows"
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && b.oom != nil && b.oom.Killed():
		// Only the memory controller's count says it was the OOM killer.
		return "killed by SIGKILL from the kernel's out-of-memory killer (its memory cgroup counts an OOM kill): the node needs more memory than it may use here"
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		return "killed by SIGKILL that the worker did not send: the kernel's out-of-memory killer is one possible cause (see dmesg), a process of the node or of this user another"
	case ws.Signaled():
		return "killed by " + unix.SignalName(ws.Signal())
	case ws.Exited() && ws.ExitStatus() != 0:
		return fmt.Sprintf("exited with code %d without answering", ws.ExitStatus())
	}
	return ""
}

// Usage is what a call's runner cost: wall time from its start to the end
// of its last process, CPU time and peak memory: of every process of the
// call from its cgroup, else of the runner (and the children it waited
// for). CPU and PeakRSSByte are 0 where they are not known.
type Usage struct {
	Wall        time.Duration
	CPU         time.Duration
	PeakRSSByte int64
}

func (b *box) usage() Usage {
	u := Usage{Wall: time.Since(b.began)}
	if state := b.exitState(); state != nil {
		u.CPU, u.PeakRSSByte = state.cpu, state.peakRSS
	}
	if b.cgCPU > 0 {
		u.CPU = b.cgCPU
	}
	if b.cgPeak > 0 {
		u.PeakRSSByte = b.cgPeak
	}
	return u
}
