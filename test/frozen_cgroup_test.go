package test

// Node code that freezes cgroups (cgroup.freeze) of its worker's calls:
// its own, and its siblings, kept for later calls, made ahead for them, or
// holding spares and zygotes. Only the whole binary shows that a cancel is
// answered, later calls run, and SIGTERM stops the worker within its
// grace while a call is frozen.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// freezerNode freezes every cgroup of its worker's calls (named as its
// own is) where others is true, writes its own cgroup's path to the file
// it is given, and freezes itself.
const freezerNode = `import os, time
def own_cgroup():
    rel = [l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(base + rel + "/cgroup.freeze"):
            return base + rel
    raise RuntimeError("no cgroup v2 directory for " + rel)

def f(mark, others):
    own = own_cgroup()
    parent, name = os.path.split(own)
    for n in os.listdir(parent) if others else []:
        d = os.path.join(parent, n)
        if n != name and n.startswith(name[:-16]) and os.path.isdir(d):
            try:
                with open(d + "/cgroup.freeze", "w") as f:
                    f.write("1")
            except OSError:
                pass
    with open(mark, "w") as f:
        f.write(own)
    with open(own + "/cgroup.freeze", "w") as f:
        f.write("1")
    time.sleep(600)
`

const pidNodeSource = `import os
def f():
    return {"pid": os.getpid()}
`

// A grace far longer than the test's bounds: an answer within them can
// only be the runtime's own, at SIGTERM, which the worker delivers by
// thawing the call's cgroup first.
const frozenTestGrace = "60s"

func TestFrozenCgroupsHoldNoCallNorTheWorker(t *testing.T) {
	skipUnlessLinux(t)
	if os.Geteuid() != 0 {
		t.Skip("freezing cgroups needs root")
	}
	for _, warm := range []string{"0", "2"} {
		t.Run("warm-"+warm, func(t *testing.T) {
			t.Parallel()
			testFrozenCgroups(t, warm)
		})
	}
}

func testFrozenCgroups(t *testing.T, warm string) {
	// Without a sandbox: in one, /sys is read-only to node code, which
	// cannot freeze a cgroup (the sandbox's own tests show that); this is
	// the worker's hold where node code can.
	_, wk, w, _ := warmWorker(t, nil, "--containment", "cgroup", "--cancel-grace", frozenTestGrace, "--warm", warm, "--parallel", "4", "--sandbox", "off")
	if !strings.Contains(w.logs.String(), "containment=cgroup") {
		t.Skip("this worker cannot make cgroups here (it needs root or a delegated cgroup v2)")
	}
	// answers runs n calls at once, each of which must answer.
	answers := func(prefix string, n int) {
		t.Helper()
		calls := make([]*enginetest.Call, n)
		for i := range calls {
			calls[i] = startNode(t, wk, nodeRun(fmt.Sprint(prefix, i), pidNodeSource, "f", nil))
		}
		for _, c := range calls {
			var out map[string]any
			answer, _ := wait(t, c)
			if answer.Decode(&out); out["ok"] != true {
				t.Errorf("call %s answered %s", c.ID, answer.Raw)
			}
		}
	}
	// Calls at once leave cgroups kept for later calls.
	answers("fill-", 3)

	// frozen starts a freezer node and waits until its own cgroup is frozen.
	frozen := func(id string, others bool) *enginetest.Call {
		t.Helper()
		mark := filepath.Join(t.TempDir(), "cgroup")
		c := startNode(t, wk, nodeRun(id, freezerNode, "f", map[string]any{"mark": mark, "others": others}))
		var dir []byte
		eventually(t, 30*time.Second, "the node to freeze its cgroup", func() bool {
			dir, _ = os.ReadFile(mark)
			b, _ := os.ReadFile(filepath.Join(string(dir), "cgroup.events"))
			return len(dir) > 0 && strings.Contains(string(b), "frozen 1")
		})
		return c
	}

	c := frozen("freezer", true)
	// Every cgroup the node could reach was frozen: later calls run anyway.
	answers("after-", 3)
	if err := wk.Cancel("freezer"); err != nil {
		t.Fatal(err)
	}
	answer, _, err := c.WaitTimeout(30 * time.Second)
	if err != nil {
		t.Fatalf("the cancel of a call whose cgroup is frozen: %v", err)
	}
	var out map[string]any
	answer.Decode(&out)
	nodeError(t, out, "NodeCancelled")

	// Its own cgroup only: one that froze the cgroup of a call still
	// ending would hold that call for the grace, SIGKILL its only way out.
	c = frozen("stopped", false)
	w.signal(syscall.SIGTERM)
	answer, _, err = c.WaitTimeout(30 * time.Second)
	if err != nil {
		t.Fatalf("SIGTERM to the worker while a call's cgroup is frozen: the call: %v", err)
	}
	answer.Decode(&out)
	nodeError(t, out, "NodeCancelled")
	if code := w.wait(30 * time.Second); code != 0 {
		t.Errorf("the worker exited %d after SIGTERM; want 0", code)
	}
}
