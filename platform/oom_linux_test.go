package platform

import (
	"os"
	"path/filepath"
	"testing"
)

// A runner's OOM watch counts the kills of its call's cgroup where the
// memory controller gives the calls' cgroups memory.events, from the
// count when the watch began: a cgroup that counted a kill before (a
// zygote's) is not taken for one that counts one now. (A directory stands
// in for the cgroup: the kernel here may not enable the memory controller
// for a test's cgroups, and cannot be made to OOM-kill on cue.)
func TestOOMWatchCountsTheCallCgroupsKills(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "memory.events")
	write := func(kills string) {
		t.Helper()
		if err := os.WriteFile(events, []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill "+kills+"\noom_group_kill 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	w := WatchOOM(&CallCgroup{dir: dir, fd: -1, memory: true})
	if w.Killed() {
		t.Error("a kill counted before the watch began is taken for one during it")
	}
	write("2")
	if !w.Killed() {
		t.Error("a kill the call's cgroup counted is not seen")
	}
	// Without the memory controller there is no such file to watch.
	if w := WatchOOM(&CallCgroup{dir: dir, fd: -1}); w.Killed() {
		t.Error("a cgroup without the memory controller is watched")
	}
}

// A counter kept open (the worker's own memory cgroups, learnt once) reads
// what the file says now, not what it said when it was opened.
func TestOOMCounterKeptOpenReadsTheCountNow(t *testing.T) {
	file := filepath.Join(t.TempDir(), "memory.oom_control")
	os.WriteFile(file, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"), 0o644)
	c := openCounter(file)
	if c == nil {
		t.Fatal("the counter could not be opened")
	}
	defer c.f.Close()
	w := &OOMWatch{}
	w.add(*c)
	if w.Killed() {
		t.Error("no kill was counted since the watch began")
	}
	os.WriteFile(file, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"), 0o644)
	if !w.Killed() {
		t.Error("the kill counted since the watch began is not seen through the open file")
	}
	if openCounter(filepath.Join(t.TempDir(), "memory.events")) != nil {
		t.Error("a counter that does not exist was opened")
	}
}
