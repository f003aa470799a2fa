package platform

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A cgroup kept for a later call that was frozen, or that a process moved
// into, after it was found reusable is not fit for a call any more, and
// says why; a frozen one is thawed by Thaw.
func TestKeptCgroupFrozenOrMovedIntoIsUnfit(t *testing.T) {
	g := reusableCgroup(t, "kept-frozen")
	if !g.Reusable() {
		t.Fatal("a new, empty cgroup is not reusable")
	}
	g = reuse(t, g)
	if why := g.Unfit(); why != "" {
		t.Fatalf("a kept cgroup nothing touched is unfit: %s", why)
	}
	if err := os.WriteFile(filepath.Join(g.Dir(), "cgroup.freeze"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if !g.Frozen() {
		t.Error("Frozen() is false for a frozen empty cgroup")
	}
	if why := g.Unusable(); !strings.Contains(why, "frozen") {
		t.Errorf("Unusable() = %q for a frozen cgroup; want it to say frozen", why)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	if g.Frozen() {
		t.Error("Frozen() is true after Thaw")
	}
	if why := g.Unfit(); !strings.Contains(why, "changed") {
		t.Errorf("Unfit() = %q for a cgroup frozen and thawed; want it to say changed", why)
	}

	for _, change := range []struct{ name, script string }{
		{"handed-to-others", "chmod 0666 cgroup.procs"},
		{"child-made", "mkdir child && rmdir child"},
		{"limit-set", "echo 5 > cgroup.max.descendants"},
	} {
		kept := reuse(t, reusableCgroup(t, "kept-"+change.name))
		// Not run in it: by node code of another call.
		if out, err := exec.Command("sh", "-c", "cd "+kept.Dir()+" && "+change.script).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", change.script, err, out)
		}
		if why := kept.Unfit(); !strings.Contains(why, "changed") {
			t.Errorf("Unfit() = %q for a kept cgroup after %q; want it to say changed", why, change.script)
		}
	}

	moved := reuse(t, reusableCgroup(t, "kept-moved-into"))
	sleeperIn(t, moved)
	if why := moved.Unusable(); !strings.Contains(why, "process") {
		t.Errorf("Unusable() = %q for a cgroup a process moved into; want it to say so", why)
	}
}
