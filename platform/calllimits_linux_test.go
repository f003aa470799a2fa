package platform

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// limitedCgroups are calls' cgroups with limits l, for the test, or skip
// where this process may make no cgroups (not root, no writable cgroup v2)
// or a limit's controller cannot be had (a container with the v1
// hierarchies read-only: SetLimits then refuses, as it should). Any other
// failure of SetLimits fails the test.
func limitedCgroups(t *testing.T, l CallLimits) *CallCgroups {
	t.Helper()
	mount, err := unifiedMount()
	if err != nil || unix.Access(mount, unix.W_OK) != nil {
		t.Skip("needs a writable cgroup v2 (root)")
	}
	cc := &CallCgroups{base: mount, prefix: "fluksio-call-" + strconv.Itoa(os.Getpid()) + "-"}
	if err := cc.SetLimits(l); errors.Is(err, ErrNoController) {
		t.Skipf("the limits cannot be had here: %v", err)
	} else if err != nil {
		t.Fatalf("SetLimits: %v", err)
	}
	return cc
}

// limitedCgroup makes one call's cgroup of cc, removed after the test.
func limitedCgroup(t *testing.T, cc *CallCgroups, name string) *CallCgroup {
	t.Helper()
	g, err := cc.New(name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Kill()
		if err := g.Remove(5 * time.Second); err != nil {
			t.Errorf("removing the test's cgroup: %v", err)
		}
		if g.limits != nil {
			for _, dir := range g.limits.v1 {
				if _, err := os.Stat(dir); err == nil {
					t.Errorf("the call's v1 cgroup %s is left after its removal", dir)
				}
			}
		}
	})
	return g
}

// startHeld starts sh, in g, to run script once told to: its process is
// in all of g's cgroups before the script runs, as a runner is before node
// code runs.
func startHeld(t *testing.T, g *CallCgroup, script string) (cmd *exec.Cmd, run func()) {
	t.Helper()
	cmd = exec.Command("sh", "-c", "read x; "+script)
	stdin, _ := cmd.StdinPipe()
	if err := StartContained(cmd); err != nil {
		t.Fatalf("cannot start sh: %v", err)
	}
	t.Cleanup(func() { Forget(cmd.Process.Pid) })
	if err := g.Move(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cmd, func() {
		stdin.Write([]byte("go\n"))
		stdin.Close()
	}
}

// A call past --call-memory-max is killed by the kernel in its own cgroup
// (the v1 memory controller where cgroup v2 has none for the calls), and
// its OOM watch says it was the call's own limit, not the machine's
// memory; the worker (this process) is untouched.
func TestCallPastItsMemoryLimitIsKilledAndToldSo(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 to allocate memory")
	}
	const limit = 64 << 20
	cc := limitedCgroups(t, CallLimits{MemoryMax: limit})
	g := limitedCgroup(t, cc, "memory")
	cmd, run := startHeld(t, g, "exec "+python+" -c 'x = b\"\\x01\" * (512 << 20); print(len(x))'")
	w := WatchOOM(g)
	if w.CallLimit() != 0 {
		t.Fatal("the watch blames the call's limit before anything ran")
	}
	run()
	err = cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("a call allocating 512MiB under a %dMiB limit ended with %v; want SIGKILL by the OOM killer", limit>>20, err)
	}
	if got := w.CallLimit(); got != limit {
		t.Errorf("CallLimit() = %d after the call's OOM kill; want its limit %d", got, limit)
	}
}

// A fork bomb under --call-pids-max stops at the limit: the call cannot
// have more processes at once, and the worker (this process) still forks.
func TestForkBombStopsAtCallPidsMax(t *testing.T) {
	const limit = 16
	cc := limitedCgroups(t, CallLimits{PidsMax: limit})
	g := limitedCgroup(t, cc, "pids")
	// Bounded, so that it is no bomb where the limit is missing: 200
	// sleepers, each of which could only be there without the limit.
	cmd, run := startHeld(t, g, `i=0; while [ $i -lt 200 ]; do sleep 600 & i=$((i+1)); done; echo "$i started"`)
	run()
	cmd.Wait() // sh ends at the loop's end, or at its fork that failed
	procs, _ := g.Procs()
	if n := len(procs); n > limit || n == 0 {
		t.Errorf("the call's cgroup holds %d processes after the fork bomb; want 1 to %d (--call-pids-max)", n, limit)
	}
	if err := exec.Command("true").Run(); err != nil {
		t.Errorf("the worker cannot start a process after a call's fork bomb: %v", err)
	}
}

// --call-cpu-max is set on the call's cgroup: cpu.max (v2), or the CFS
// quota of its v1 cpu cgroup.
func TestCallCPUMaxIsSetOnTheCallsCgroup(t *testing.T) {
	cc := limitedCgroups(t, CallLimits{CPUMax: 0.5})
	g := limitedCgroup(t, cc, "cpu")
	b, err := os.ReadFile(filepath.Join(g.dir, "cpu.max"))
	if err == nil && strings.Contains(string(b), "50000 100000") {
		return
	}
	var v1 []string
	if g.limits != nil {
		v1 = g.limits.v1
	}
	for _, dir := range v1 {
		if q, _ := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us")); strings.TrimSpace(string(q)) == "50000" {
			return
		}
	}
	t.Errorf("no cgroup of the call holds a quota of half a CPU (cpu.max %q, v1 cgroups %v)", b, v1)
}

// Calls' cgroups with limits are never reused: a later call would carry
// the counters of the last.
func TestLimitedCgroupsAreNotReused(t *testing.T) {
	cc := limitedCgroups(t, CallLimits{PidsMax: 64})
	g := limitedCgroup(t, cc, "reuse")
	if g.Reusable() {
		t.Error("a call's cgroup with limits is reusable")
	}
}
