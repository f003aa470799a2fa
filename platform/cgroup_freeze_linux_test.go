package platform

import (
	"os"
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

	moved := reuse(t, reusableCgroup(t, "kept-moved-into"))
	sleeperIn(t, moved)
	if why := moved.Unusable(); !strings.Contains(why, "process") {
		t.Errorf("Unusable() = %q for a cgroup a process moved into; want it to say so", why)
	}
}
