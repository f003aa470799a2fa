//go:build linux

package runner

import (
	"strconv"
	"strings"
	"testing"
)

// --warm 1 where spares are started one by one is one spare, said so.
func TestWarmShownWithoutZygotes(t *testing.T) {
	if forksHere() {
		t.Skip("this process forks spares from zygotes")
	}
	if got := WarmShown(0); !strings.Contains(got, "off (--warm 0)") {
		t.Errorf("--warm 0: %q", got)
	}
	if got := WarmShown(1); got != "1 spare runner started ahead (--warm 1)" {
		t.Errorf("--warm 1 without zygotes: %q", got)
	}
}

// --warm 1 where spares are forked from a zygote keeps more than one
// spare, and the zygote: what the worker says about --warm counts them.
func TestWarmShownCountsForkedSpares(t *testing.T) {
	if !inContainedChild(t) {
		return
	}
	got := WarmShown(1)
	if !strings.HasPrefix(got, "1 spare runner started ahead (--warm 1)") ||
		!strings.Contains(got, "with one environment, "+strconv.Itoa(1+forkedSparesAhead)+" spare runners and a zygote") {
		t.Errorf("--warm 1 with forked spares: %q; want the spare asked for, how many an environment keeps, and its zygote", got)
	}
}
