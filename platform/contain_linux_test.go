package platform

import (
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

// startSleeper starts `sleep` in a process group of its own with env
// added, and kills its group when the test ends.
func startSleeper(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), env...)
	NewProcessGroup(cmd)
	if err := StartContained(cmd); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		Forget(cmd.Process.Pid)
	})
	return cmd
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The cookie finds a call's processes wherever they went, except those
// of the group that is signalled as a group.
func TestFindCookie(t *testing.T) {
	cookie := "cookie-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	a := startSleeper(t, "TEST_COOKIE="+cookie)
	b := startSleeper(t, "TEST_COOKIE="+cookie)
	startSleeper(t, "TEST_COOKIE=other-"+cookie)
	got := FindCookie("TEST_COOKIE", cookie, 0)
	if len(got) != 2 || !(got[0] == a.Process.Pid || got[1] == a.Process.Pid) || !(got[0] == b.Process.Pid || got[1] == b.Process.Pid) {
		t.Errorf("FindCookie = %v; want %d and %d", got, a.Process.Pid, b.Process.Pid)
	}
	if got := FindCookie("TEST_COOKIE", cookie, a.Process.Pid); len(got) != 1 || got[0] != b.Process.Pid {
		t.Errorf("FindCookie leaving out %d's group = %v; want %d", a.Process.Pid, got, b.Process.Pid)
	}
}

func TestProcessGroupSignals(t *testing.T) {
	cmd := startSleeper(t)
	pid := cmd.Process.Pid
	if pgid, _ := syscall.Getpgid(pid); pgid != pid {
		t.Fatalf("NewProcessGroup: %d is in group %d", pid, pgid)
	}
	if !GroupAlive(pid) || !ProcessAlive(pid) {
		t.Fatal("a running sleeper's group is not alive")
	}
	if !SignalGroup(pid, syscall.SIGKILL) {
		t.Error("SignalGroup reported no group")
	}
	cmd.Wait()
	if GroupAlive(pid) || ProcessAlive(pid) {
		t.Error("a killed and reaped group is still alive")
	}
	if SignalGroup(pid, syscall.SIGTERM) || SignalGroup(0, syscall.SIGTERM) {
		t.Error("SignalGroup found a group that is gone")
	}
}

func TestRaiseOOMScore(t *testing.T) {
	cmd := startSleeper(t)
	if err := RaiseOOMScore(cmd.Process.Pid, 500); err != nil {
		t.Skipf("oom_score_adj not writable here: %v", err)
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/oom_score_adj")
	if strings.TrimSpace(string(b)) != "500" {
		t.Errorf("oom_score_adj = %q; want 500", b)
	}
	if MaxRSSBytes(3) != 3<<10 {
		t.Error("MaxRSSBytes does not read KiB")
	}
}

// As a subreaper, this process adopts what a child leaves behind when it
// exits; ReapOrphans reaps such orphans, but never a runner os/exec waits
// for.
func TestReapOrphans(t *testing.T) {
	mode, err := SetupContainment()
	if err != nil || mode != ContainSubreaper {
		t.Skipf("cannot become a subreaper: %s %v", mode, err)
	}
	runner := startSleeper(t)
	// A child in a group of its own starts a grandchild that exits soon
	// after its parent: the grandchild is adopted by this process.
	sh := exec.Command("sh", "-c", "sleep 0.2 & echo $!")
	NewProcessGroup(sh)
	out, err := sh.Output()
	if err != nil {
		t.Fatal(err)
	}
	orphan, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	waitFor(t, "the orphan to exit and wait, adopted, as a zombie", func() bool {
		s, ok := readStat(orphan)
		return ok && s.state == 'Z' && s.ppid == os.Getpid()
	})
	reaped := 0
	waitFor(t, "ReapOrphans to reap it", func() bool {
		reaped += ReapOrphans()
		_, ok := readStat(orphan)
		return !ok
	})
	if reaped < 1 {
		t.Errorf("ReapOrphans reaped %d", reaped)
	}
	// The registered runner, once exited, is left to os/exec's Wait.
	syscall.Kill(runner.Process.Pid, syscall.SIGKILL)
	waitFor(t, "the runner to be a zombie", func() bool {
		s, ok := readStat(runner.Process.Pid)
		return ok && s.state == 'Z'
	})
	ReapOrphans()
	if err := runner.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("os/exec's Wait for a registered runner: %v; want its own exit status, not reaped behind it", err)
	}
}

func TestDetectInventory(t *testing.T) {
	inv := DetectInventory(Overrides{})
	if inv.CPUs < 1 || inv.RAMMB == nil || *inv.RAMMB < 1 {
		t.Errorf("this machine's inventory %+v; want at least a CPU and some memory", inv)
	}
	if inv := DetectInventory(Overrides{CPUs: 7}); inv.CPUs != 7 {
		t.Errorf("--cpus 7 gave %d", inv.CPUs)
	}
}

// A leftover call cgroup in the root cgroup whose worker is gone is
// removed at start even when cgroups were made under it (a process in it
// set up cgroups of its own): children first. Else each start waits for
// it, a second per leftover, and leaves it.
func TestRootLeftoverWithChildrenIsRemoved(t *testing.T) {
	mount, err := unifiedMount()
	own, oerr := ownCgroup()
	if err != nil || oerr != nil || own != "/" || unix.Access(mount, unix.W_OK) != nil {
		t.Skip("needs to run in a writable root cgroup v2 (root, hybrid or unified hierarchy)")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(mount, "fluksio-call-"+strconv.Itoa(gone.Process.Pid)+"-probe-test")
	deep := filepath.Join(leftover, "worker-1", "worker", "call-probe-1", "worker-2")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Skipf("cannot make cgroups here: %v", err)
	}
	t.Cleanup(func() { exec.Command("find", leftover, "-depth", "-type", "d", "-exec", "rmdir", "{}", ";").Run() })
	cc := &CallCgroups{base: mount}
	start := time.Now()
	cc.clearRootLeftovers()
	if _, err := os.Stat(leftover); err == nil {
		t.Errorf("the leftover %s with cgroups under it is still there", leftover)
	}
	t.Logf("cleared in %v", time.Since(start))
}
