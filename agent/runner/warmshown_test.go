//go:build linux

package runner

import (
	"strconv"
	"strings"
	"testing"
)

// --warm 1 where spares are started one by one is one spare, said so.
func TestWarmShownWithoutZygotes(t *testing.T) {
	if forksHere(nil) {
		t.Skip("this process forks spares from zygotes")
	}
	if got := WarmDetail(0, nil); !strings.Contains(got, "off (--warm 0)") {
		t.Errorf("--warm 0: %q", got)
	}
	if got := WarmDetail(1, nil); got != "1 spare runner started ahead (--warm 1)" {
		t.Errorf("--warm 1 without zygotes: %q", got)
	}
}

// --warm 1 where spares are forked from a zygote keeps more than one
// spare, and the zygote: what the worker says about --warm counts them.
func TestWarmShownCountsForkedSpares(t *testing.T) {
	if !inContainedChild(t) {
		return
	}
	if short := WarmShown(1); short != "1 spare runner kept ready (--warm 1)" {
		t.Errorf("--warm 1, shown in status and the start's log: %q; want a few plain words (the detail is WarmDetail's)", short)
	}
	got := WarmDetail(1, nil)
	if !strings.HasPrefix(got, "1 spare runner started ahead (--warm 1)") ||
		!strings.Contains(got, "with one environment, "+strconv.Itoa(1+forkedSparesAhead)+" spare runners and a zygote") {
		t.Errorf("--warm 1 with forked spares: %q; want the spare asked for, how many an environment keeps, and its zygote", got)
	}
}

// The warm line of status and of the start's log is a few plain words,
// however spares are kept; how is WarmDetail's.
func TestWarmShownIsShort(t *testing.T) {
	for _, n := range []int{0, 1, 2, 16} {
		got := WarmShown(n)
		if len(got) > 60 || strings.Contains(got, "zygote") {
			t.Errorf("--warm %d shown as %q (%d characters); want a few plain words", n, got, len(got))
		}
	}
	if got := WarmShown(2); got != "2 spare runners kept ready (--warm 2)" {
		t.Errorf("--warm 2 shown as %q", got)
	}
}
