package platform

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reusableCgroup makes a call's cgroup watched for changes, as SetupCgroups
// makes them where the memory controller is not enabled for calls.
func reusableCgroup(t *testing.T, name string) *CallCgroup {
	t.Helper()
	g := testCgroup(t, name)
	g.Remove(time.Second)
	cc := &CallCgroups{base: filepath.Dir(g.dir), prefix: "fluksio-call-" + strconv.Itoa(os.Getpid()) + "-"}
	cc.setReuse(false)
	if cc.watch == nil {
		t.Skip("no inotify here")
	}
	g, err := cc.New(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Kill()
		g.Remove(5 * time.Second)
	})
	return g
}

// reuse hands g on to another call, removed with the test.
func reuse(t *testing.T, g *CallCgroup) *CallCgroup {
	next := g.Reuse()
	t.Cleanup(func() {
		next.Kill()
		next.Remove(5 * time.Second)
	})
	return next
}

// A cgroup its call left empty and unchanged may serve another call, and
// then counts only that call's CPU: an earlier call's is not reported
// again.
func TestReusedCgroupCountsOnlyItsCallsCPU(t *testing.T) {
	g := reusableCgroup(t, "reused-cpu")
	runIn(t, g, burn)
	first := g.CPU()
	if first <= 0 {
		t.Fatalf("CPU() = %v after a call that burnt some; want its time", first)
	}
	if !g.Reusable() {
		t.Fatal("an empty cgroup nothing changed is not reusable")
	}
	g = reuse(t, g)
	if cpu := g.CPU(); cpu != 0 {
		t.Errorf("a reused cgroup reports %v before anything ran in it; want 0", cpu)
	}
	runIn(t, g, "true")
	if second := g.CPU(); second <= 0 || second >= first {
		t.Errorf("a reused cgroup reports %v for a call that ran `true`, after one that burnt %v; want only its own", second, first)
	}
}

// A cgroup that node code changed is not reused: a limit set, a cgroup
// made under it, its files handed to someone else; nor one killed through
// cgroup.kill (a process started into it later would be killed at birth).
// Processes moved into it are not changes.
func TestChangedCgroupIsNotReusable(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		reusable     bool
	}{
		{"unchanged", "true", true},
		{"process-moved-in", `sh -c 'echo $$ > cgroup.procs'`, true},
		{"limit-set", "echo 5 > cgroup.max.descendants", false},
		{"frozen-thawed", "echo 0 > cgroup.freeze", false},
		{"child-made", "mkdir child && rmdir child", false},
		{"handed-to-others", "chmod 0666 cgroup.procs", false},
		{"killed", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := reusableCgroup(t, "changed-"+tc.name)
			if tc.script != "" {
				runIn(t, g, "cd "+g.Dir()+" && "+tc.script)
			} else {
				g.Kill() // as the end of a call does when processes are left
			}
			if got := g.Reusable(); got != tc.reusable {
				t.Errorf("after %q Reusable() = %v; want %v", tc.script, got, tc.reusable)
			}
		})
	}
}

// A cgroup with a process in it, or where cgroups are not watched (the
// memory controller is enabled for calls), is not reusable.
func TestCgroupNotReusable(t *testing.T) {
	g := reusableCgroup(t, "populated")
	sleeperIn(t, g)
	if g.Reusable() {
		t.Error("a cgroup with a process in it is reusable")
	}
	if testCgroup(t, "unwatched").Reusable() {
		t.Error("a cgroup made without a watch is reusable")
	}
}

// What the last call's box still holds once its cgroup was handed on
// reaches nothing of the next call: no signal, no kill, no move, no
// removal; it says the cgroup is empty.
func TestHandedOnCgroupReachesNothing(t *testing.T) {
	g := reusableCgroup(t, "handed-on")
	if !g.Reusable() {
		t.Fatal("a new, empty cgroup is not reusable")
	}
	next := reuse(t, g)
	sleeper := sleeperIn(t, next)
	g.Kill()
	if g.Signal(syscall.SIGKILL, 0) || g.Populated() || !g.WaitEmpty(time.Hour) || g.Reusable() {
		t.Error("the handed-on value says the next call's cgroup holds something, or signalled it")
	}
	if err := g.Move(os.Getpid()); err == nil {
		t.Error("the handed-on value moved a process into the next call's cgroup")
	}
	if err := g.Remove(0); err != nil {
		t.Error(err)
	}
	if !ProcessAlive(sleeper.Process.Pid) || !next.Populated() {
		t.Fatal("the next call's process was killed through the last call's value")
	}
	if _, err := os.Stat(next.Dir()); err != nil {
		t.Errorf("the next call's cgroup was removed through the last call's value: %v", err)
	}
}

// A removed cgroup's watch ends with it: the kernel does not end a watch
// on a cgroup when the cgroup is removed (cgroup2 on 6.x), and a worker
// that left them grew by one watch for every cgroup it ever made (1,245
// after five minutes of mixed work), toward the user's
// fs.inotify.max_user_watches, which every program of that user shares.
func TestRemovedCgroupLeavesNoWatch(t *testing.T) {
	g := reusableCgroup(t, "watch-ends")
	if n := inotifyWatchCount(t, g.watcher.fd); n != 1 {
		t.Fatalf("the call's cgroup has %d watches; want 1", n)
	}
	if err := g.Remove(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := inotifyWatchCount(t, g.watcher.fd); n != 0 {
		t.Errorf("after the cgroup was removed its watcher still has %d watches; want none", n)
	}
}

// inotifyWatchCount counts the watches of this process's inotify
// instance fd, from /proc/self/fdinfo.
func inotifyWatchCount(t *testing.T, fd int) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "inotify ") {
			n++
		}
	}
	return n
}
