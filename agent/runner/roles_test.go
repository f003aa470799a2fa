//go:build linux

package runner

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// roleNode answers with what an operator sees of the process that runs
// it: its comm (ps -e, top) and its cgroup.
const roleNode = `import os
def f():
    with open("/proc/self/comm") as c, open("/proc/self/cgroup") as g:
        return {"comm": c.read().strip(), "cgroup": [l for l in g.read().split("\n") if l.startswith("0::")][0][3:]}
`

// commOf is the comm of pid: what ps -e and top show.
func commOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// cgroupOf is the cgroup v2 path of pid.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			return path
		}
	}
	t.Fatalf("process %d has no cgroup v2 path:\n%s", pid, b)
	return ""
}

// cgroupRole is the role a cgroup's name says: call, spare or zygote, as
// in call-… (in the worker's subtree) or fluksio-call-<worker>-… (in
// the root cgroup).
func cgroupRole(path string) string {
	role, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(path), "fluksio-"), "-")
	return role
}

// runRoles runs roleNode and returns its comm and cgroup.
func (z *zygoteRig) runRoles(t *testing.T, id string) (pid int, comm, cgroup string) {
	t.Helper()
	c, err := z.runNode(context.Background(), id, roleNode)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	out := answer(t, c.output(t))
	outputs, ok := out["outputs"].(map[string]any)
	if !ok {
		t.Fatalf("call %s failed: %s", id, c.outputLine(out))
	}
	pid = c.box.pid
	c.end(t, true)
	comm, _ = outputs["comm"].(string)
	cgroup, _ = outputs["cgroup"].(string)
	return pid, comm, cgroup
}

// An operator tells a zygote, a spare waiting for its call and a call's
// runner apart by their process titles (comm) and their cgroups' names.
// A spare's cgroup keeps its name when it serves its call (cgroup v2
// renames none): its process says it is a call's.
func TestRolesShowInProcessTitlesAndCgroupNames(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	z := newZygoteRig(t, 1, nil)
	zyg, spares := z.forking(t, warmOneKeeps)
	if got := commOf(t, zyg); got != "fluksio-zygote" {
		t.Errorf("the zygote's comm is %q; want fluksio-zygote", got)
	}
	if got := cgroupOf(t, zyg); cgroupRole(got) != "zygote" {
		t.Errorf("the zygote's cgroup is %s; want one named zygote-…", got)
	}
	for _, pid := range spares {
		// A forked spare is ready once the zygote answered its fork: it
		// names itself as it runs, a moment later.
		deadline := time.Now().Add(waitLong)
		for commOf(t, pid) == "fluksio-zygote" && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := commOf(t, pid); got != "fluksio-spare" {
			t.Errorf("the waiting spare %d's comm is %q; want fluksio-spare", pid, got)
		}
		if got := cgroupOf(t, pid); cgroupRole(got) != "spare" {
			t.Errorf("the waiting spare %d's cgroup is %s; want one named spare-…", pid, got)
		}
	}
	pid, comm, cg := z.runRoles(t, "in-a-spare")
	if !containsInt(spares, pid) {
		t.Fatalf("the call ran in %d; want one of the spares %v", pid, spares)
	}
	if comm != "fluksio-call" {
		t.Errorf("the call's runner (a spare handed the call) says its comm is %q; want fluksio-call", comm)
	}
	if cgroupRole(cg) != "spare" {
		t.Errorf("the call's runner (a spare handed the call) is in %s; want the spare's cgroup, named spare-…", cg)
	}

	cold := newZygoteRig(t, 0, nil) // every runner started cold, for its call
	if _, comm, cg := cold.runRoles(t, "cold"); comm != "fluksio-call" || cgroupRole(cg) != "call" {
		t.Errorf("a runner started cold for its call has the comm %q and the cgroup %s; want fluksio-call in one named call-…", comm, cg)
	}
}
