package platform

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testCgroup makes a call's cgroup for the test, or skips where this
// process may not make one (not root, no writable cgroup v2).
func testCgroup(t *testing.T, name string) *CallCgroup {
	t.Helper()
	mount, err := unifiedMount()
	if err != nil || unix.Access(mount, unix.W_OK) != nil {
		t.Skip("needs a writable cgroup v2 (root)")
	}
	cc := &CallCgroups{base: mount, prefix: rootCallPrefix + workerID() + "-"}
	g, err := cc.New(name)
	if err != nil {
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	t.Cleanup(func() {
		g.Kill()
		if err := g.Remove(5 * time.Second); err != nil {
			t.Errorf("removing the test's cgroup: %v", err)
		}
	})
	return g
}

// sleeperIn starts `sleep` and moves it into g; the test kills it.
func sleeperIn(t *testing.T, g *CallCgroup) *exec.Cmd {
	t.Helper()
	cmd := startSleeper(t)
	if err := g.Move(cmd.Process.Pid); err != nil {
		t.Fatalf("moving the sleeper into the cgroup: %v", err)
	}
	if !g.Populated() {
		t.Fatal("the cgroup holding the sleeper is not populated")
	}
	return cmd
}

// WaitEmpty returns as the cgroup's last process exits, woken by the
// kernel: before the process is reaped (an exited process has left), and
// long before the bound of the wait.
func TestWaitEmptyReturnsWhenTheLastProcessExits(t *testing.T) {
	g := testCgroup(t, "wait-empty")
	cmd := sleeperIn(t, g)
	result := make(chan bool, 1)
	go func() { result <- g.WaitEmpty(time.Hour) }()
	// Not reaped: only killed, so it is a zombie of this process.
	syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	select {
	case empty := <-result:
		if !empty {
			t.Error("WaitEmpty reported the cgroup populated after its last process exited")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitEmpty did not return after the cgroup's last process exited")
	}
}

// A cgroup that does not empty ends the wait at its bound, saying so.
func TestWaitEmptyEndsAtItsBound(t *testing.T) {
	g := testCgroup(t, "wait-populated")
	sleeperIn(t, g)
	if g.WaitEmpty(50 * time.Millisecond) {
		t.Error("WaitEmpty reported a cgroup empty while its process runs")
	}
	if g.WaitEmpty(0) {
		t.Error("WaitEmpty(0) reported a cgroup empty while its process runs")
	}
}

// An empty cgroup, or one already removed, is empty at once.
func TestWaitEmptyOfAnEmptyCgroup(t *testing.T) {
	g := testCgroup(t, "wait-empty-at-once")
	if !g.WaitEmpty(0) {
		t.Error("WaitEmpty(0) reported an empty cgroup populated")
	}
	if err := g.Remove(time.Second); err != nil {
		t.Fatal(err)
	}
	if !g.WaitEmpty(time.Hour) {
		t.Error("WaitEmpty reported a removed cgroup populated")
	}
}

// startIn starts sh in g, to run script once it is in; finish lets it
// run, and waits for it to exit and for g to empty.
func startIn(t *testing.T, g *CallCgroup, script string) (finish func()) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read x; "+script)
	stdin, _ := cmd.StdinPipe()
	if err := StartContained(cmd); err != nil {
		t.Skipf("cannot start sh: %v", err)
	}
	t.Cleanup(func() { Forget(cmd.Process.Pid) })
	if err := g.Move(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		stdin.Write([]byte("go\n")) // in the cgroup now
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		if !g.WaitEmpty(10 * time.Second) {
			t.Fatal("the cgroup did not empty after its process exited")
		}
	}
}

// runIn runs script with sh in g until it exits, and waits for g to empty.
func runIn(t *testing.T, g *CallCgroup, script string) {
	t.Helper()
	startIn(t, g, script)()
}

// burn is a script that spends some CPU.
const burn = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`

// The files a call reads at every end (cgroup.events, cpu.stat) are kept
// open from the cgroup's making: what they say follows the cgroup, from
// its first process to after the last one left, and a removed cgroup says
// it holds nothing instead of failing.
func TestCallCgroupFilesFollowItsProcesses(t *testing.T) {
	g := testCgroup(t, "kept-files")
	if g.Populated() || g.Signal(syscall.SIGKILL, 0) {
		t.Fatal("a new cgroup says it holds a process")
	}
	finish := startIn(t, g, burn)
	if !g.Populated() {
		t.Error("the cgroup holding a process says it is empty")
	}
	if !g.Signal(0, 0) {
		t.Error("Signal found nothing in the cgroup holding a process")
	}
	finish()
	if g.Populated() || g.Signal(syscall.SIGKILL, 0) {
		t.Error("the emptied cgroup says it holds a process")
	}
	if cpu := g.CPU(); cpu <= 0 {
		t.Errorf("CPU() = %v after a process burnt some in the cgroup; want its time", cpu)
	}
	if err := g.Remove(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if g.Populated() || g.CPU() != 0 || !g.WaitEmpty(time.Hour) {
		t.Error("a removed cgroup says it holds something")
	}
}
