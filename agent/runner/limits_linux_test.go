package runner

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/platform"
)

// limitsEnv gives the contained child test process a --call-memory-max
// (TestMain sets it after containment).
const limitsEnv = "FLUKSIO_RUNNER_TEST_CALL_MEMORY_MAX"

// noLimits is why the contained child's calls have no limits where
// limitsEnv asked for them: the controller cannot be had here.
var noLimits error

// setTestLimits holds the contained child's calls to the memory limit
// limitsEnv gives, if any.
func setTestLimits() error {
	if os.Getenv(limitsEnv) == "" {
		return nil
	}
	err := SetCallLimits(platform.ContainCgroup, platform.CallLimits{MemoryMax: 64 << 20})
	if errors.Is(err, platform.ErrNoController) {
		noLimits, err = err, nil
	}
	return err
}

// underTestLimits runs the test again in the contained child process with
// limitsEnv's memory limit, and reports true in that child, where the test
// goes on; it skips where the limit cannot be had.
func underTestLimits(t *testing.T) bool {
	t.Helper()
	if !containedChild {
		t.Setenv(limitsEnv, "1")
	}
	if !inContainedChild(t) {
		return false
	}
	if noLimits != nil {
		t.Skipf("the memory limit cannot be had here: %v", noLimits)
	}
	return true
}

// A call past --call-memory-max is killed by the kernel, and what the
// engine is told says it was the call's own limit, with its size.
func TestCallPastItsMemoryLimitSaysSo(t *testing.T) {
	if !underTestLimits(t) {
		return
	}
	r := newRig(t, nil)
	c := r.mustStart(context.Background(), "over-limit", nil, map[string]any{"alloc_mb": 512})
	if out := c.output(t); out.Answer != nil {
		t.Fatalf("a call allocating 512MiB under a 64MiB limit answered %q", out.Answer)
	}
	const want = "the node process stopped: killed by SIGKILL from the kernel's out-of-memory killer: the call reached its own memory limit of 64MiB (--call-memory-max"
	if got := c.DeathMessage(); !strings.HasPrefix(got, want) {
		t.Errorf("DeathMessage() = %q; want %q…", got, want)
	}
	c.end(t, false)
}

// Under --call-memory-max, a zygote pins none of its pages for its forks:
// a fork's copies of them would be charged to the zygote's cgroup, which
// holds that limit too, not to its call's.
func TestZygoteUnderACallMemoryLimitPinsNothing(t *testing.T) {
	if !underTestLimits(t) {
		return
	}
	if !ioUringUsable() {
		t.Skip("io_uring cannot be had here: no zygote pins pages anyway")
	}
	z := newZygoteRig(t, 1, nil)
	z.runPID(t, "teach")
	zyg := z.zygote(t)
	for i := range 4 {
		z.runPID(t, "limited-"+strconv.Itoa(i))
	}
	if kib := pinnedKiB(zyg); kib != 0 {
		t.Errorf("the zygote holds %d KiB pinned under a per-call memory limit; want none", kib)
	}
}

// Limits cannot be had without a cgroup per call: the worker refuses to
// start, saying what to do, rather than run calls without them.
func TestCallLimitsWithoutCgroupsAreRefused(t *testing.T) {
	err := SetCallLimits(platform.ContainSubreaper, platform.CallLimits{PidsMax: 10})
	if err == nil || !strings.Contains(err.Error(), "Delegate=yes") {
		t.Errorf("SetCallLimits without cgroups = %v; want a refusal saying what to do", err)
	}
	if err := SetCallLimits(platform.ContainSubreaper, platform.CallLimits{}); err != nil {
		t.Errorf("SetCallLimits without limits = %v; want nil", err)
	}
}

// Where calls have limits, a runner whose call's cgroup could not be made
// is not started: it would run without them.
func TestLimitedCallWithoutItsCgroupIsNotStarted(t *testing.T) {
	if !underTestLimits(t) {
		return
	}
	// A box made ahead whose cgroup could not be made: a cookie, no cgroup.
	b := &box{log: slog.New(slog.DiscardHandler), cookie: "0123456789abcdef0123456789abcdef"}
	cmd := exec.Command("true")
	if err := b.start(cmd); !errors.Is(err, errNoLimitedCgroup) {
		t.Errorf("starting a runner without its call's cgroup under limits: %v; want it refused", err)
	}
	if cmd.Process != nil {
		t.Error("the runner was started")
	}
}
