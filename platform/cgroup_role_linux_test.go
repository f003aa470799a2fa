package platform

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A cgroup is named for what it is made for (call-…, spare-…, zygote-…;
// fluksio-spare-<worker>-… in the root cgroup), and every role's
// leftovers are cleared: a gone worker's in the root cgroup, a worker's
// own from before a reload in its subtree.
func TestCgroupsNamedForTheirRoleAndClearedAsLeftovers(t *testing.T) {
	shared := sharedTestCgroup(t)
	roles := map[CgroupRole]string{CgroupCall: "call", CgroupSpare: "spare", CgroupZygote: "zygote"}

	// In a worker's subtree.
	sub := &CallCgroups{base: shared, prefix: "call-"}
	for role, word := range roles {
		g, err := sub.NewFor(role, "x")
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(shared, word+"-x"); g.Dir() != want || g.Role() != role {
			t.Errorf("a cgroup made for %s is %s (%s); want %s", word, g.Dir(), g.Role(), want)
		}
		if g.Reuse().Role() != role {
			t.Errorf("a cgroup made for %s, reused, says it is for %s", word, g.Reuse().Role())
		}
		g.closeFD() // left as a worker re-executed for a reload finds it
	}
	other := filepath.Join(shared, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	sub.clearLeftovers()
	for _, word := range roles {
		if dir := filepath.Join(shared, word+"-x"); fileExists(dir) {
			t.Errorf("the worker's own %s is left after its reload", dir)
		}
	}
	if !fileExists(other) {
		t.Errorf("%s, no cgroup of the worker's calls, was removed", other)
	}

	// In the root cgroup.
	root := &CallCgroups{base: shared, prefix: rootCallPrefix + "999999998.1-"}
	var held []string
	for role, word := range roles {
		gone := filepath.Join(shared, "fluksio-"+word+"-999999999.1-x")
		if err := os.Mkdir(gone, 0o755); err != nil {
			t.Fatal(err)
		}
		g, err := root.NewFor(role, "y")
		if err != nil {
			t.Fatal(err)
		}
		defer g.Remove(5 * time.Second)
		if want := filepath.Join(shared, "fluksio-"+word+"-999999998.1-y"); g.Dir() != want {
			t.Errorf("a cgroup made for %s in the root cgroup is %s; want %s", word, g.Dir(), want)
		}
		held = append(held, g.Dir())
	}
	(&CallCgroups{base: shared}).clearRootLeftovers()
	for _, word := range roles {
		if dir := filepath.Join(shared, "fluksio-"+word+"-999999999.1-x"); fileExists(dir) {
			t.Errorf("the gone worker's %s is left", dir)
		}
	}
	for _, dir := range held {
		if !fileExists(dir) {
			t.Errorf("%s, held by a running worker, was removed", dir)
		}
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
