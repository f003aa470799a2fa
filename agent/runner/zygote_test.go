//go:build linux

package runner

// Zygotes driven for real: Debian's /usr/bin/python3 running the embedded
// runtime (../runtime/worker_main.py) in zygote mode, in a test process
// that contains calls in cgroups. Containment is a property of the whole
// process (a subreaper, the cgroups made for calls), and the other tests
// of this package run the fake runner, which has no zygote mode: so
// TestZygotes runs itself again in a child test process that sets
// containment up first (the helper-process pattern), and its subtests run
// there.

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/platform"
)

// containedEnv marks the child test process that contains calls in
// cgroups (TestMain sets containment up there).
const containedEnv = "FLUKSIO_RUNNER_TEST_CONTAINED"

const systemPython = "/usr/bin/python3"

// containedChild is set in that child process.
var containedChild bool

// inContainedChild runs the test again in a child process with a cgroup per
// call, and reports true in that child: only there does the test go on.
// It skips where zygotes cannot be used (not root, no writable cgroup v2,
// no /usr/bin/python3).
func inContainedChild(t *testing.T) bool {
	t.Helper()
	if containedChild {
		if !forksHere() {
			t.Fatal("the contained child test process cannot fork calls from zygotes")
		}
		return true
	}
	switch {
	case os.Geteuid() != 0 || platform.ProbeCgroups() != nil:
		t.Skip("zygotes need a cgroup per call (root with a writable cgroup v2)")
	case !fileExists(systemPython):
		t.Skip("zygote tests run " + systemPython)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), containedEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the contained test process failed: %v\n%s", err, out)
	}
	t.Logf("the contained test process:\n%s", out)
	return false
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// zygoteRig is a pool whose runners are the embedded runtime on
// /usr/bin/python3, forked from zygotes.
type zygoteRig struct {
	*rig
	m *metrics.Metrics
}

func newZygoteRig(t *testing.T, spares int, change func(*Config)) *zygoteRig {
	t.Helper()
	rt, err := filepath.Abs("../runtime/worker_main.py")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m := metrics.New("test", 1)
	r := &rig{t: t, log: &enginetest.Buffer{}, runtime: rt}
	r.cfg = Config{
		Python:      systemPython,
		StateDir:    filepath.Join(dir, "state"),
		BaseEnv:     []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir},
		CancelGrace: testGrace,
		MaxLine:     1 << 20,
		Spares:      spares,
		Metrics:     m,
		Log:         slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if change != nil {
		change(&r.cfg)
	}
	r.pool = NewPool(r.cfg)
	t.Cleanup(func() {
		r.pool.Close()
		if t.Failed() {
			t.Logf("the runner's log:\n%s", r.log.String())
		}
	})
	return &zygoteRig{rig: r, m: m}
}

// pidNode answers with the pid of the process that ran it.
const pidNode = `import os
def f():
    return {"pid": os.getpid()}
`

// run starts a call of the node that reports its pid.
func (z *zygoteRig) run(ctx context.Context, id string) (*call, error) {
	req, _ := json.Marshal(map[string]any{
		"op": "run", "call_id": id, "function": "f", "inputs": map[string]any{}, "settings": map[string]any{},
		"node": map[string]any{"source": pidNode, "filename": "pipeline.py"},
	})
	c := &call{id: id, events: make(chan []byte, 1024)}
	p, err := z.pool.Start(ctx, Spec{
		CallID:  id,
		Runtime: Runtime{Path: z.runtime, Embedded: true},
		Request: append(req, '\n'),
		Log:     z.cfg.Log.With("call_id", id),
		Send:    func(msg []byte) { c.events <- append([]byte(nil), msg...); frame.Put(msg) },
	})
	c.Process = p
	return c, err
}

// runPID runs one call to its end and returns the pid that answered.
func (z *zygoteRig) runPID(t *testing.T, id string) int {
	t.Helper()
	c, err := z.run(context.Background(), id)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	a := answer(t, c.output(t))
	if ok, _ := a["ok"].(bool); !ok {
		t.Fatalf("call %s failed: %s", id, c.outputLine(a))
	}
	c.end(t, true)
	return pidOf(a["outputs"].(map[string]any), "pid")
}

func (c *call) outputLine(a map[string]any) string {
	b, _ := json.Marshal(a)
	return string(b)
}

// zygote waits for the pool's ready zygote and returns its pid.
func (z *zygoteRig) zygote(t *testing.T, not ...int) int {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for time.Now().Before(deadline) {
		p := z.pool.warm
		p.mu.Lock()
		pid := 0
		for _, we := range p.envs {
			if we.zyg != nil && we.zyg.ready && !we.zyg.retired {
				pid = we.zyg.box.pid
			}
		}
		p.mu.Unlock()
		if pid != 0 && !containsInt(not, pid) {
			return pid
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no zygote ready within %s", waitLong)
	return 0
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// parentOf is the parent pid of a process, from /proc.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

var _ = syscall.SIGSTOP

func TestZygotes(t *testing.T) {
	if !inContainedChild(t) {
		return
	}
	t.Run("ForkedSpareServesACall", func(t *testing.T) {
		t.Parallel()
		z := newZygoteRig(t, 1, nil)
		first := z.runPID(t, "teach")
		zyg := z.zygote(t)
		spare := z.waitSpare(t, z.m)
		if spare == first || spare == zyg {
			t.Fatalf("the spare %d is the first call's runner (%d) or the zygote (%d)", spare, first, zyg)
		}
		for i := range 20 {
			t0 := time.Now()
			got := z.runPID(t, "warm"+strconv.Itoa(i))
			t.Logf("call %d: %v", i, time.Since(t0))
			_ = got
		}
	})
}
