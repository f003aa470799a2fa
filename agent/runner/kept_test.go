//go:build linux

package runner

// Calls' cgroups kept for later calls, tampered with by node code of
// another call while they wait: frozen, or a process moved into one. Run
// in the contained child test process (inContainedChild), with Debian's
// Python running the embedded runtime.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/platform"
)

// cloneIntoEnv makes this test executable answer containment's probe as
// the worker does (--version), so that runners are started straight into
// their cgroups; without it the probe fails (an unknown flag), and they are
// moved in after they start.
const cloneIntoEnv = "FLUKSIO_RUNNER_TEST_CLONE_INTO"

// ownCgroupPy finds the node's own cgroup directory (own) in Python.
const ownCgroupPy = `
def own_cgroup():
    rel = [l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(base + rel + "/cgroup.freeze"):
            return base + rel
    raise RuntimeError("no cgroup v2 directory for " + rel)
`

// tamperNode finds the idle cgroups of its worker's calls (its own
// cgroup's siblings, named as it is: kept for later calls, or made ahead
// for them), moves a process of its own into the first and freezes the
// others.
const tamperNode = `import os, subprocess
` + ownCgroupPy + `
def f():
    own = own_cgroup()
    parent, name = os.path.split(own)
    prefix = name[:-16]
    idle = []
    for n in sorted(os.listdir(parent)):
        d = os.path.join(parent, n)
        if n != name and n.startswith(prefix) and os.path.isdir(d):
            if "populated 0" in open(d + "/cgroup.events").read():
                idle.append(d)
    if not idle:
        return {"idle": 0}
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(idle[0] + "/cgroup.procs", "w") as f:
        f.write(str(child.pid))
    for d in idle[1:]:
        with open(d + "/cgroup.freeze", "w") as f:
            f.write("1")
    return {"idle": len(idle), "child": child.pid, "moved": idle[0]}
`

// startsAndAnswers runs a call that must start and answer within
// waitLong: a start into a frozen cgroup never ends by itself.
func (z *zygoteRig) startsAndAnswers(t *testing.T, id string) {
	t.Helper()
	started := make(chan *call, 1)
	go func() {
		c, err := z.run(context.Background(), id)
		if err != nil {
			t.Errorf("call %s: Start: %v", id, err)
			c = nil
		}
		started <- c
	}()
	select {
	case c := <-started:
		if c == nil {
			t.FailNow()
		}
		a := answer(t, c.output(t))
		if ok, _ := a["ok"].(bool); !ok {
			t.Fatalf("call %s failed: %s", id, c.outputLine(a))
		}
		c.end(t, true)
	case <-time.After(waitLong):
		t.Fatalf("call %s did not start within %s", id, waitLong)
	}
}

// exits waits for pid to exit.
func exits(t *testing.T, pid int, what string) {
	t.Helper()
	w := platform.WatchExit(pid)
	defer w.Close()
	select {
	case <-w.Exited():
	case <-time.After(waitLong):
		t.Fatalf("%s (pid %d) still runs after %s", what, pid, waitLong)
	}
}

// The cgroups a pool keeps for later calls, and those of boxes made
// ahead, are checked before a runner goes into one: one that node code of
// another call froze, or moved a process into, is killed and removed, and
// the calls that come later start and answer. A process moved into an idle
// kept cgroup is killed once its own call ends.
// Both where runners are started straight into their cgroup and where
// they are moved in.
func TestTamperedKeptCgroupsServeNoCall(t *testing.T) {
	for _, mode := range []struct{ name, env string }{{"clone-into", cloneIntoEnv + "=1"}, {"moved-in", ""}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			if inContainedChild(t, mode.env) {
				testTamperedKeptCgroups(t)
			}
		})
	}
}

func testTamperedKeptCgroups(t *testing.T) {
	z := newZygoteRig(t, 0, nil) // cold starts: boxes made ahead take the kept cgroups
	// Three calls at once leave three cgroups kept, and three boxes made ahead.
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { z.startsAndAnswers(t, fmt.Sprint("fill-", i)) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	c, err := z.runNode(context.Background(), "tamper", tamperNode)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	a := answer(t, c.output(t))
	out, _ := a["outputs"].(map[string]any)
	if pidOf(out, "idle") < 2 {
		t.Fatalf("the node found fewer than two idle cgroups of its worker's calls to tamper with: %s", c.outputLine(a))
	}
	child := pidOf(out, "child")
	killLater(t, child)
	c.end(t, true)
	exits(t, child, "a process the node moved into a cgroup kept for later calls, after its call ended")

	for i := range 4 {
		z.startsAndAnswers(t, fmt.Sprint("after-node-", i))
	}

	// Frozen by node code of a call that still runs: the kept ones are
	// checked when they are handed out, those of boxes made ahead when a
	// runner is started into them.
	z.pool.behind.Wait()
	var frozen []string
	k := z.pool.cfg.cgroups
	k.mu.Lock()
	for _, g := range k.free {
		frozen = append(frozen, g.Dir())
	}
	k.mu.Unlock()
	z.pool.boxes.mu.Lock()
	for _, m := range z.pool.boxes.ready {
		if m.box.cg != nil {
			frozen = append(frozen, m.box.cg.Dir())
		}
	}
	z.pool.boxes.mu.Unlock()
	if len(frozen) == 0 {
		t.Fatal("the pool keeps no cgroup, kept or made ahead, to freeze")
	}
	for _, dir := range frozen {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range len(frozen) + 1 {
		z.startsAndAnswers(t, fmt.Sprint("after-test-", i))
	}
	if log := z.log.String(); !strings.Contains(log, "changed before its call could use it") {
		t.Errorf("the log does not say a kept cgroup was found changed:\n%s", log)
	}
	z.pool.Close()
	for _, dir := range frozen {
		if fileExists(dir) {
			t.Errorf("the frozen cgroup %s is left after Pool.Close", dir)
		}
	}
}

// A runner started straight into a cgroup that is frozen (node code froze
// it after it was checked) stops before it execs, its start waiting in
// the clone: the start is bounded, the runner killed, the cgroup removed,
// and the error says why. Also where the bound passes before the clone has
// put the runner in the cgroup (a loaded machine; here a bound of 1 ns).
func TestStartIntoAFrozenCgroupFails(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t, cloneIntoEnv+"=1") {
		return
	}
	if !callCgroupsSet().CloneInto() {
		t.Skip("runners are moved into their cgroup here, not started into it")
	}
	z := newZygoteRig(t, 0, nil)
	for _, bound := range []time.Duration{500 * time.Millisecond, time.Nanosecond} {
		z.pool.cfg.cgroups.startWithin = bound
		b := &box{log: z.cfg.Log, kept: z.pool.cfg.cgroups}
		b.makeAhead()
		if b.cg == nil {
			t.Fatal("the box has no cgroup")
		}
		dir := b.cg.Dir()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("/bin/true")
		b.prepare(cmd, nil)
		done := make(chan error, 1)
		go func() { done <- b.startInto(cmd) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "frozen") {
				t.Fatalf("bound %s: a start into a frozen cgroup returned %v; want an error that says it is frozen", bound, err)
			}
			t.Log(err)
		case <-time.After(waitLong):
			t.Fatalf("bound %s: a start into a frozen cgroup did not return within %s", bound, waitLong)
		}
		if b.cg != nil {
			t.Errorf("bound %s: the box keeps the frozen cgroup", bound)
		}
		z.pool.cfg.cgroups.discarding.Wait()
		if fileExists(dir) {
			t.Errorf("bound %s: the frozen cgroup %s is left", bound, dir)
		}
	}
}

// freezeSelfNode freezes its own call's cgroup, and so itself.
const freezeSelfNode = `import os, time
` + ownCgroupPy + `
def f():
    with open(own_cgroup() + "/cgroup.freeze", "w") as f:
        f.write("1")
    time.sleep(600)
`

// A call whose node froze its own cgroup is thawed when it is stopped:
// the node gets SIGTERM and its grace, and the runtime answers the cancel.
func TestCancelOfAFrozenCallIsAnswered(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	// A long grace: SIGKILL only after the test's bound; the runtime, its
	// SIGTERM delivered, answers at once.
	z := newZygoteRig(t, 0, func(c *Config) { c.CancelGrace = waitLong })
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	c, err := z.runNode(ctx, "frozen", freezeSelfNode)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	deadline := time.Now().Add(waitLong)
	for !c.box.cg.Frozen() {
		if time.Now().After(deadline) {
			t.Fatalf("the node did not freeze its cgroup within %s", waitLong)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel(&StopError{Reason: "cancelled by the test"})
	a := answer(t, c.output(t))
	if e, _ := a["error"].(map[string]any); e["type"] != protocol.TypeNodeCancelled {
		t.Errorf("answer %s; want the runtime's NodeCancelled", c.outputLine(a))
	}
	c.end(t, true)
}

// Pool.Close kills what moved into a cgroup kept for later calls, and
// removes the cgroup.
func TestCloseKillsWhatMovedIntoAKeptCgroup(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	z := newZygoteRig(t, 0, nil)
	z.runPID(t, "fill")
	z.pool.behind.Wait()
	k := z.pool.cfg.cgroups
	k.mu.Lock()
	var dir string
	if len(k.free) > 0 {
		dir = k.free[0].Dir()
	}
	k.mu.Unlock()
	if dir == "" {
		t.Fatal("no cgroup is kept after a call")
	}
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	killLater(t, sleeper.Process.Pid)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	z.pool.Close()
	exits(t, sleeper.Process.Pid, "a process moved into a kept cgroup, after Pool.Close")
	sleeper.Wait()
	if fileExists(dir) {
		t.Errorf("the kept cgroup %s is left after Pool.Close", dir)
	}
}
