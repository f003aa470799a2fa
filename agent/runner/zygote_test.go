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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

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
// no /usr/bin/python3). env is added to the child's environment.
func inContainedChild(t *testing.T, env ...string) bool {
	t.Helper()
	if containedChild {
		if !forksHere(nil) {
			t.Fatalf("the contained child test process cannot fork calls from zygotes (cgroups per call: %v; a subreaper: %v, asked once, and %v now)",
				callCgroupsSet() != nil, isSubreaper(), platform.IsSubreaper())
		}
		return true
	}
	switch {
	case os.Geteuid() != 0 || platform.ProbeCgroups() != nil:
		t.Skip("zygotes need a cgroup per call (root with a writable cgroup v2)")
	case !fileExists(systemPython):
		t.Skip("zygote tests run " + systemPython)
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v"}
	if deadline, ok := t.Deadline(); ok {
		// A child that hangs times out first, and its goroutines are shown.
		args = append(args, "-test.timeout="+(time.Until(deadline)*9/10).String())
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), containedEnv+"=1"), env...)
	// What the child left holding its output (a runner it forked, frozen
	// before its exec) must not keep this test waiting once it has exited.
	cmd.WaitDelay = 10 * time.Second
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
	r.open(change)
	return &zygoteRig{rig: r, m: m}
}

// pidNode answers with the pid of the process that ran it.
const pidNode = `import os
def f():
    return {"pid": os.getpid()}
`

// fdsNode answers with what each of its descriptors is.
const fdsNode = `import os
def f():
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink("/proc/self/fd/" + name))
        except OSError:
            pass  # listdir's own, closed
    return {"fds": fds}
`

// lingeringNode answers with its pid and that of a process it leaves
// running: in a session of its own, ignoring SIGTERM.
const lingeringNode = `import os, subprocess, sys
def f():
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"],
                             start_new_session=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    child.stdout.readline()  # it ignores SIGTERM from here on
    return {"pid": os.getpid(), "child": child.pid}
`

// run starts a call of the node that reports its pid.
func (z *zygoteRig) run(ctx context.Context, id string) (*call, error) {
	return z.runNode(ctx, id, pidNode)
}

// runNode starts a call of a node whose function is f.
func (z *zygoteRig) runNode(ctx context.Context, id, source string) (*call, error) {
	return z.runNodeIn(ctx, id, source, nil)
}

// runNodeIn starts a call of a node whose function is f, with the
// request's env.
func (z *zygoteRig) runNodeIn(ctx context.Context, id, source string, env []string) (*call, error) {
	req, _ := json.Marshal(map[string]any{
		"op": "run", "call_id": id, "function": "f", "inputs": map[string]any{}, "settings": map[string]any{},
		"node": map[string]any{"source": source, "filename": "pipeline.py"},
	})
	c := &call{id: id, events: make(chan []byte, 1024)}
	p, err := z.pool.Start(ctx, Spec{
		CallID:  id,
		Runtime: Runtime{Path: z.runtime, Embedded: true},
		Env:     env,
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

// forking teaches z an environment, and waits for its zygote and n spares
// forked from it.
func (z *zygoteRig) forking(t *testing.T, n int) (zyg int, spares []int) {
	t.Helper()
	z.runPID(t, "teach")
	zyg = z.zygote(t)
	return zyg, z.waitForked(t, n)
}

// stoppedZygote teaches z an environment, waits for its zygote and the
// spares forked from it, and stops the zygote (SIGSTOP) until the test
// ends or continues it.
func (z *zygoteRig) stoppedZygote(t *testing.T) (zyg int, spares []int) {
	t.Helper()
	zyg, spares = z.forking(t, warmOneKeeps)
	syscall.Kill(zyg, syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(zyg, syscall.SIGCONT) })
	return zyg, spares
}

// runForked starts a call of source that must run in one of the forked
// spares.
func (z *zygoteRig) runForked(t *testing.T, id, source string, spares []int) *call {
	t.Helper()
	c, err := z.runNode(context.Background(), id, source)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if !containsInt(spares, c.box.pid) {
		t.Fatalf("call %s ran in %d; want one of the forked spares %v", id, c.box.pid, spares)
	}
	return c
}

// endsUnanswered checks that c's runner ended without an answer, that
// its death message says how (want), and that End says what it cost.
func endsUnanswered(t *testing.T, c *call, want string) {
	t.Helper()
	if out := c.output(t); out.Answer != nil {
		t.Fatalf("call %s answered %s; want its runner to end first", c.id, out.Answer)
	}
	if msg := c.DeathMessage(); !strings.Contains(msg, want) {
		t.Errorf("call %s: the death message is %q; want it to say %q", c.id, msg, want)
	}
	if u := c.end(t, false); u.CPU <= 0 || u.PeakRSSByte <= 0 {
		t.Errorf("call %s: End says it cost %+v; want its CPU and peak memory", c.id, u)
	}
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
			if we.zyg != nil && we.zyg.state == spareReady {
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
// pinnedKiB is the memory process pid holds pinned (its VmPin), in KiB.
func pinnedKiB(pid int) int {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmPin:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kib
		}
	}
	return 0
}

// ioUringUsable reports whether this process may make an io_uring, as a
// zygote pinning pages for its forks does.
func ioUringUsable() bool {
	var params [120]byte // struct io_uring_params
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return false
	}
	unix.Close(int(fd))
	return true
}

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

// readyForked lists the pids of the ready spares (forks of the zygote).
func (z *zygoteRig) readyForked() []int { return z.readySpares() }

// warmOneKeeps is how many forked spares a rig with one warm slot keeps.
// A test that runs a call in "one of the spares" waits for all of them:
// one forked after a snapshot of fewer may serve the call as well.
const warmOneKeeps = 1 + forkedSparesAhead

// waitForked waits until n forked spares are ready.
func (z *zygoteRig) waitForked(t *testing.T, n int) []int {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for time.Now().Before(deadline) {
		if pids := z.readyForked(); len(pids) >= n {
			return pids
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fewer than %d forked spares ready within %s: %v", n, waitLong, z.readyForked())
	return nil
}

// sparesKept counts the spares of the pool's environments, ready or
// being forked.
func (z *zygoteRig) sparesKept() int {
	p := z.pool.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, we := range p.envs {
		n += len(we.spares)
	}
	return n
}

// zygoteState says whether the zygote with pid is still the pool's, ready.
func (z *zygoteRig) zygoteIs(pid int) bool {
	p := z.pool.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, we := range p.envs {
		if we.zyg != nil && we.zyg.state == spareReady && we.zyg.box.pid == pid {
			return true
		}
	}
	return false
}

// forkInFlight reports whether the zygote's one fork at a time is taken.
func (z *zygoteRig) forkInFlight() bool {
	p := z.pool.warm
	p.mu.Lock()
	var zyg *zygote
	for _, we := range p.envs {
		if we.zyg != nil {
			zyg = we.zyg
		}
	}
	p.mu.Unlock()
	if zyg == nil || !zyg.mu.TryLock() {
		return zyg != nil
	}
	zyg.mu.Unlock()
	return false
}

func TestZygotes(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	t.Run("WedgedZygoteDoesNotDelayACall", func(t *testing.T) {
		t.Parallel()
		z := newZygoteRig(t, 1, nil)
		z.pool.warm.forkTimeout = 2 * waitLong // a fork ahead stays in flight for the whole test
		// Nor is the stopped zygote replaced for the exits it cannot
		// report (ZygoteStoppedWhileItsRunnersExitIsReplaced).
		z.pool.warm.exitReportWait = 2 * waitLong
		zyg, spares := z.stoppedZygote(t)
		// A call takes a spare; its replacement's fork then waits on the
		// stopped zygote, holding it.
		var forked []*call // their ends wait for the zygote's reports
		started := func(id, source string) (*call, map[string]any) {
			c, err := z.runNode(context.Background(), id, source)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			a := answer(t, c.output(t))
			if ok, _ := a["ok"].(bool); !ok {
				t.Fatalf("call %s failed: %s", id, c.outputLine(a))
			}
			if containsInt(spares, c.box.pid) {
				forked = append(forked, c)
			}
			return c, a
		}
		started("takes-a-spare", pidNode)
		deadline := time.Now().Add(waitLong)
		for !z.forkInFlight() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !z.forkInFlight() {
			t.Fatal("no fork in flight on the stopped zygote")
		}
		// Calls take the spares left, then start cold: none waits for
		// the fork in flight, which gives up only after forkTimeout.
		for i := range 1 + forkedSparesAhead + 1 {
			if c, _ := started("while-wedged-"+strconv.Itoa(i), pidNode); !containsInt(spares, c.box.pid) {
				c.end(t, true)
			}
		}
		// Nor does the end of a call whose orphan the worker must reap
		// (the reaper and a fork in flight share a lock).
		c, a := started("orphan-while-wedged", lingeringNode)
		killLater(t, pidOf(a["outputs"].(map[string]any), "child"))
		c.end(t, true)
		if !z.forkInFlight() || !z.zygoteIs(zyg) {
			t.Fatal("a call waited for the wedged zygote's fork to give up")
		}
		if misses := metric(t, z.m, "fluksio_worker_warm_runner_misses_total"); misses < 2 {
			t.Errorf("%v calls started cold; want the teaching one and at least one while the zygote was wedged", misses)
		}
		if len(forked) != len(spares) {
			t.Fatalf("%d calls ran in the forked spares %v; want each", len(forked), spares)
		}
		// The forked runners exited while the zygote was stopped: once it
		// goes on, it reaps them, and their calls end with how they ended.
		syscall.Kill(zyg, syscall.SIGCONT)
		for _, c := range forked {
			c.end(t, true)
			if e := c.box.exitState(); e == nil || e.err() != nil {
				t.Errorf("call %s: its runner ended %+v; want exit status 0", c.id, e)
			}
		}
	})
	t.Run("ExitStatusReachesTheWorker", func(t *testing.T) {
		t.Parallel()
		// A forked runner is its zygote's child: how it ended reaches the
		// worker in the zygote's report.
		z := newZygoteRig(t, 1, nil)
		z.runPID(t, "teach")
		zyg := z.zygote(t)
		for _, tc := range []struct{ name, source, want string }{
			{"exits-7", "import os\ndef f():\n    os._exit(7)\n", "exited with code 7 without answering"},
			{"killed", "import os, signal\ndef f():\n    os.kill(os.getpid(), signal.SIGUSR1)\n", "killed by SIGUSR1"},
		} {
			c := z.runForked(t, tc.name, tc.source, z.waitForked(t, warmOneKeeps))
			if parent := parentOf(c.box.pid); parent != zyg && parent != 0 {
				t.Errorf("call %s: its runner's parent is %d; want the zygote %d", tc.name, parent, zyg)
			}
			endsUnanswered(t, c, tc.want)
		}
	})
	t.Run("ZygoteKilledWhileItsRunnerRuns", func(t *testing.T) {
		t.Parallel()
		// Its runner is re-parented to the worker, which waits for it
		// itself: the call ends with how its runner ended, and nothing of
		// it is left.
		z := newZygoteRig(t, 1, nil)
		zyg, spares := z.forking(t, warmOneKeeps)
		fifo := filepath.Join(t.TempDir(), "go")
		if err := unix.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		c := z.runForked(t, "outlives-its-zygote", "import os\ndef f():\n    open("+strconv.Quote(fifo)+").read()\n    os._exit(7)\n", spares)
		runner := c.box.pid
		killed, _ := os.FindProcess(zyg)
		killed.Kill()
		deadline := time.Now().Add(waitLong)
		for parentOf(runner) != os.Getpid() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if ppid := parentOf(runner); ppid != os.Getpid() {
			t.Fatalf("the runner's parent is %d once its zygote was killed; want the worker %d", ppid, os.Getpid())
		}
		if err := os.WriteFile(fifo, []byte("go"), 0); err != nil { // the node goes on: it exits 7
			t.Fatal(err)
		}
		endsUnanswered(t, c, "exited with code 7")
		gone(t, "after End", runner, zyg)
		// Calls go on, forked from a new zygote.
		next := z.zygote(t, zyg)
		spares = z.waitForked(t, warmOneKeeps)
		if got := z.runPID(t, "after"); !containsInt(spares, got) {
			t.Errorf("the call ran in %d; want a spare forked from the new zygote %d: %v", got, next, spares)
		}
	})
	t.Run("ZygoteStoppedWhileItsRunnersExitIsReplaced", func(t *testing.T) {
		t.Parallel()
		// A zygote that does not report a runner's exit (stopped here) is
		// replaced: its runners are left to the worker, which finds how
		// they ended itself, and so does a spare that died waiting.
		z := newZygoteRig(t, 1, nil)
		zyg, spares := z.stoppedZygote(t)
		c := z.runForked(t, "exits-7", "import os\ndef f():\n    os._exit(7)\n", spares)
		for _, pid := range spares {
			if pid != c.box.pid {
				syscall.Kill(pid, syscall.SIGKILL) // a spare that dies while it waits
			}
		}
		endsUnanswered(t, c, "exited with code 7")
		next := z.zygote(t, zyg)
		for _, pid := range spares {
			if platform.ProcessAlive(pid) {
				t.Errorf("the forked spare %d outlived its zygote's replacement", pid)
			}
		}
		gone(t, "the replaced zygote", zyg)
		spares = z.waitForked(t, warmOneKeeps)
		if got := z.runPID(t, "after"); !containsInt(spares, got) {
			t.Errorf("the call ran in %d; want a spare forked from the new zygote %d: %v", got, next, spares)
		}
		if log := z.log.String(); !strings.Contains(log, "did not report a runner's exit") {
			t.Errorf("the log does not say the zygote was replaced for an exit it did not report:\n%s", log)
		}
	})
	t.Run("CallEndsOnceItsRunnerExitedNotOnceItIsReported", func(t *testing.T) {
		t.Parallel()
		// A stopped zygote reaps nothing and reports nothing (nor is it
		// replaced for that here): the kernel's word that the runner
		// exited, and its empty cgroup, free the call's slot; what it cost
		// follows the report.
		z := newZygoteRig(t, 1, nil)
		z.pool.warm.exitReportWait = 2 * waitLong
		zyg, spares := z.stoppedZygote(t)
		c := z.runForked(t, "exits", pidNode, spares)
		answer(t, c.output(t))
		usage := make(chan func() Usage, 1)
		go func() { usage <- c.End(true) }()
		var cost func() Usage
		select {
		case cost = <-usage:
		case <-time.After(waitLong):
			t.Fatalf("End waited %s for the stopped zygote to report its runner's exit", waitLong)
		}
		if w := platform.WatchExit(c.box.pid); w.Exited() != nil {
			if !w.HasExited() {
				t.Errorf("End returned while its runner %d still runs", c.box.pid)
			}
			w.Close()
		}
		if !c.box.cg.WaitEmpty(0) {
			t.Error("End returned while the call's cgroup still holds processes")
		}
		if parentOf(c.box.pid) != zyg {
			t.Fatalf("the runner %d is not the stopped zygote's zombie: the report came another way", c.box.pid)
		}
		syscall.Kill(zyg, syscall.SIGCONT)
		if u := cost(); u.CPU <= 0 || u.PeakRSSByte <= 0 {
			t.Errorf("once reported, the call cost %+v; want its CPU and peak memory", u)
		}
		gone(t, "once reported", c.box.pid)
	})
	t.Run("DeadSpareOfAStoppedZygoteIsNotHandedACall", func(t *testing.T) {
		t.Parallel()
		// The stopped zygote does not report its spares' deaths (nor is it
		// replaced for that here): the kernel's word keeps them from calls.
		z := newZygoteRig(t, 1, nil)
		z.pool.warm.exitReportWait = 2 * waitLong
		_, spares := z.stoppedZygote(t)
		// Dead as the kernel says once all of a spare's threads are gone
		// (its pidfd), not when its main thread is a zombie (/proc): a
		// spare has a thread watching for a cancel, which may exit later.
		for _, pid := range spares {
			w := platform.WatchExit(pid)
			defer w.Close()
			syscall.Kill(pid, syscall.SIGKILL)
			select {
			case <-w.Exited():
			case <-time.After(waitLong):
				t.Fatalf("the killed spare %d did not exit within %s", pid, waitLong)
			}
		}
		if got := z.runPID(t, "after-the-kill"); containsInt(spares, got) {
			t.Errorf("the call ran in %d, one of the killed spares %v", got, spares)
		}
	})
	t.Run("ForkedSpareServesACall", func(t *testing.T) {
		t.Parallel()
		z := newZygoteRig(t, 1, nil)
		first := z.runPID(t, "teach")
		zyg := z.zygote(t)
		spares := z.waitForked(t, 1+forkedSparesAhead)
		if containsInt(spares, first) || containsInt(spares, zyg) {
			t.Fatalf("the spares %v include the first call's runner (%d) or the zygote (%d)", spares, first, zyg)
		}
		if parentOf(spares[0]) != zyg {
			t.Errorf("a forked spare's parent is %d; want its zygote %d, which reaps it", parentOf(spares[0]), zyg)
		}
		if got := z.runPID(t, "warm"); !containsInt(spares, got) {
			t.Errorf("the call ran in %d; want one of the forked spares %v", got, spares)
		}
		// Back to back, every call finds a forked spare ready: the one
		// kept ahead, while the last call's replacement is forked.
		for i := range 10 {
			z.runPID(t, "back-to-back-"+strconv.Itoa(i))
		}
		if misses := metric(t, z.m, "fluksio_worker_warm_runner_misses_total"); misses != 1 {
			t.Errorf("%v calls started cold; want only the one that taught the environment", misses)
		}
		// Each runner's exit was reported in time: a zygote that serves is
		// never taken for wedged.
		if log := z.log.String(); strings.Contains(log, "did not report a runner's exit") {
			t.Errorf("the zygote was replaced for an exit it did not report:\n%s", log)
		}
	})
	t.Run("ReplacementWaitsForTheCallWhileSparesAreLeft", func(t *testing.T) {
		t.Parallel()
		// --warm 2: two calls at once have spares. Only a call's end
		// starts its replacement, never the delay.
		z := newZygoteRig(t, 2, nil)
		z.pool.warm.replaceDelay = 2 * waitLong
		z.runPID(t, "teach")
		z.zygote(t)
		spares := z.waitForked(t, 1+forkedSparesAhead)
		c, err := z.run(context.Background(), "running")
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		// The call has answered and its runner is still there: no fork
		// beside it takes the CPU it answers with.
		ran := pidOf(answer(t, c.output(t))["outputs"].(map[string]any), "pid")
		if !containsInt(spares, ran) {
			t.Fatalf("the call ran in %d; want one of the forked spares %v", ran, spares)
		}
		if n := z.sparesKept(); n != forkedSparesAhead {
			t.Errorf("%d spares ready or being forked while the call runs; want the %d left, its replacement not yet forked", n, forkedSparesAhead)
		}
		// A second call while the first runs takes the last spare: the
		// spares left no longer cover the calls at once, so they are
		// forked at once, as many as now ran at once and one more.
		second, err := z.run(context.Background(), "second")
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if n := z.sparesKept(); n != 2+forkedSparesAhead {
			t.Errorf("%d spares ready or being forked once the last was taken; want %d forked at once", n, 2+forkedSparesAhead)
		}
		answer(t, second.output(t))
		second.end(t, true)
		c.end(t, true)
		next := z.waitForked(t, 2+forkedSparesAhead)
		if containsInt(next, ran) {
			t.Errorf("the ended call's runner is among the spares %v", next)
		}
	})
	t.Run("ForksCopyAtOnceThePagesTheirRunnersWrite", func(t *testing.T) {
		t.Parallel()
		// Without a per-call memory limit, the zygote pins the pages its
		// first forked runner listed as written (worker_main.py's
		// ForkPinning): each later fork copies them at once.
		if !ioUringUsable() {
			t.Skip("io_uring cannot be had here")
		}
		z := newZygoteRig(t, 1, nil)
		z.runPID(t, "teach")
		zyg := z.zygote(t)
		// The first forked spare lists its pages before its call; the fork
		// after that list pins them.
		for i := 0; pinnedKiB(zyg) == 0 && i < 20; i++ {
			z.runPID(t, "learn-"+strconv.Itoa(i))
		}
		if kib := pinnedKiB(zyg); kib == 0 || kib > 16<<10 {
			t.Fatalf("the zygote holds %d KiB pinned after 20 forked calls; want the pages its runners write (some MiB)", kib)
		}
		// No runner holds the ring that pins them, once it serves a call.
		c, err := z.runNode(context.Background(), "fds", fdsNode)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		a := answer(t, c.output(t))
		outputs, _ := a["outputs"].(map[string]any)
		fds, _ := outputs["fds"].([]any)
		if len(fds) == 0 {
			t.Fatalf("the node saw no descriptor: %s", c.outputLine(a))
		}
		for _, target := range fds {
			if strings.Contains(target.(string), "io_uring") {
				t.Errorf("a forked runner holds its zygote's %s: %v", target, fds)
			}
		}
		c.end(t, true)
	})
	t.Run("KilledZygoteIsReplaced", func(t *testing.T) {
		t.Parallel()
		z := newZygoteRig(t, 1, nil)
		zyg, before := z.forking(t, warmOneKeeps)
		killed, _ := os.FindProcess(zyg)
		killed.Kill()
		// Calls go on while a new zygote starts: a spare forked before
		// serves the first (the worker waits for it itself now).
		if got := z.runPID(t, "meanwhile"); !containsInt(before, got) {
			t.Errorf("the call after the kill ran in %d; want one of the spares forked before it %v", got, before)
		}
		next := z.zygote(t, zyg)
		spares := z.waitForked(t, warmOneKeeps)
		if got := z.runPID(t, "after"); !containsInt(spares, got) {
			t.Errorf("the call ran in %d; want a spare forked from the new zygote %d: %v", got, next, spares)
		}
		gone(t, "the killed zygote", zyg)
	})
	t.Run("EnvironmentPushedOutKeepsItsZygoteAndNoSpare", func(t *testing.T) {
		t.Parallel()
		// One warm slot: a call of another environment takes it. The
		// first environment's forked spares are stopped (one left
		// behind would wait up to spareMaxAge), its zygote stays (no
		// runner, and one of the few environments kept), and its next
		// call is forked from that zygote rather than started cold.
		z := newZygoteRig(t, 1, nil)
		zyg, spares := z.forking(t, warmOneKeeps)
		// Their exits, as the kernel says (a zombie until the zygote
		// reaps it counts), watched while they run.
		var watches []*platform.ExitWatch
		for _, pid := range spares {
			w := platform.WatchExit(pid)
			defer w.Close()
			if w.Exited() == nil {
				t.Skip("no pidfd here (Linux 5.3, or a seccomp filter denies it)")
			}
			watches = append(watches, w)
		}
		c, err := z.runNodeIn(context.Background(), "other-environment", pidNode, []string{"OMP_NUM_THREADS=3"})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if a := answer(t, c.output(t)); a["ok"] != true {
			t.Fatalf("the call failed: %s", c.outputLine(a))
		}
		c.end(t, true)
		if containsInt(spares, c.box.pid) {
			t.Fatalf("the call of another environment ran in %d, a spare of the first %v", c.box.pid, spares)
		}
		for i, w := range watches {
			select {
			case <-w.Exited():
			case <-time.After(waitLong):
				t.Errorf("the first environment's forked spare %d still runs %s later", spares[i], waitLong)
			}
		}
		p := z.pool.warm
		p.mu.Lock()
		for _, we := range p.envs {
			if !slices.Contains(we.env, "OMP_NUM_THREADS=3") && len(we.spares) > 0 {
				t.Errorf("the environment pushed out still keeps %d spares", len(we.spares))
			}
		}
		p.mu.Unlock()
		if !z.zygoteIs(zyg) {
			t.Fatalf("the first environment's zygote %d was stopped; want it kept", zyg)
		}
		c, err = z.runNode(context.Background(), "first-again", "import os\ndef f():\n    return {'parent': os.getppid()}\n")
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		a := answer(t, c.output(t))
		c.end(t, true)
		if parent := pidOf(a["outputs"].(map[string]any), "parent"); parent != zyg {
			t.Errorf("the first environment's next call ran in a child of %d; want one forked from its zygote %d", parent, zyg)
		}
	})
}

// messyNode leaves files, a read-only directory and its call directory
// opened to others; it answers with what it found in its call directory
// when it began, and that directory's path and mode.
const messyNode = `import os, stat
def f():
    d = os.environ["FLUKSIO_CALL_DIR"]
    found = sorted(n for n in os.listdir(d) if n.startswith("left-"))
    mode = stat.S_IMODE(os.stat(d).st_mode)
    open(os.path.join(d, "left-file"), "w").write("secret of the last call")
    os.makedirs(os.path.join(d, "left-dir", "sub"))
    open(os.path.join(d, "left-dir", "sub", "f"), "w").write("x")
    os.chmod(os.path.join(d, "left-dir"), 0o500)
    os.chmod(d, 0o777)
    return {"dir": d, "mode": mode, "found": found}
`

// With a cgroup per call, a call's directory is emptied once the call's
// processes are gone and serves a later call: the same path, private
// again, nothing of the earlier call in it.
func TestZygoteCallDirIsReusedEmpty(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	z := newZygoteRig(t, 0, nil) // cold starts: boxes made ahead take the emptied directories
	seen := map[string]bool{}
	reused := false
	for i := range 4 {
		c, err := z.runNode(context.Background(), "messy-"+strconv.Itoa(i), messyNode)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		a := answer(t, c.output(t))
		if ok, _ := a["ok"].(bool); !ok {
			t.Fatalf("call %d failed: %s", i, c.outputLine(a))
		}
		c.end(t, true)
		out := a["outputs"].(map[string]any)
		dir, _ := out["dir"].(string)
		if found, _ := out["found"].([]any); len(found) > 0 {
			t.Errorf("call %d found what an earlier call left in %s: %v", i, dir, found)
		}
		if mode, _ := out["mode"].(float64); mode != 0o700 {
			t.Errorf("call %d: its directory %s had mode %o; want 0700", i, dir, int(mode))
		}
		reused = reused || seen[dir]
		seen[dir] = true
	}
	if !reused {
		t.Errorf("no call directory served a second call: %v", seen)
	}
	z.pool.Close()
	for dir := range seen {
		if fileExists(dir) {
			t.Errorf("%s is left after Pool.Close", dir)
		}
	}
}

// End returns, and the slot passes to the next call, only once every
// process of the call is gone, one that escaped its group and ignores
// SIGTERM included: never more than --parallel calls' processes at once.
// Removing its cgroup and directory goes on behind, and is over once
// Pool.Close returns.
func TestZygoteCallHandsItsSlotOnOnceItsProcessesAreGone(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	z := newZygoteRig(t, 1, nil)
	var left []string // the calls' cgroups and directories
	for i := range 2 {
		c, err := z.runNode(context.Background(), "lingering-"+strconv.Itoa(i), lingeringNode)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if c.box.cg == nil {
			t.Fatal("the call has no cgroup")
		}
		left = append(left, c.box.cg.Dir(), c.dir.path)
		out := answer(t, c.output(t))["outputs"].(map[string]any)
		runner, child := pidOf(out, "pid"), pidOf(out, "child")
		killLater(t, child)
		u := c.end(t, true)
		// The slot is free now: nothing of the call may run any more.
		gone(t, "after End", runner, child)
		if !c.box.cg.WaitEmpty(0) {
			t.Errorf("call %d: its cgroup still holds processes after End", i)
		}
		if u.CPU <= 0 || u.PeakRSSByte <= 0 {
			t.Errorf("call %d: End says it cost %+v; want its CPU and peak memory", i, u)
		}
	}
	z.pool.Close()
	for _, path := range left {
		if fileExists(path) {
			t.Errorf("%s is left after Pool.Close", path)
		}
	}
	if log := z.log.String(); !strings.Contains(log, "still running after it was stopped") && !strings.Contains(log, "did not stop within --cancel-grace") {
		t.Errorf("the log does not say the lingering process was killed:\n%s", log)
	}
}

// burnNode spends about half a second of CPU.
const burnNode = `import time
def f():
    t0 = time.process_time()
    while time.process_time() - t0 < 0.5:
        pass
    return {}
`

// A call's cgroup, emptied and unchanged after its call, serves a later
// call (boxes made ahead take it): that call reports only its own CPU, not
// the earlier call's, and what it leaves running is still found and killed.
// Pool.Close removes the cgroups kept.
func TestReusedCgroupCountsItsOwnCallAndKillsItsLeftovers(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	z := newZygoteRig(t, 0, nil)          // cold starts: boxes made ahead take the emptied cgroups
	seen := map[string]bool{}             // the calls' cgroups
	burntIn := map[string]time.Duration{} // what a burning call reported in each
	reused := 0
	compared := 0
	// Burning calls first, then lingering ones: the boxes made ahead take
	// turns, so the later calls run in the earlier calls' cgroups.
	for i := range 4 {
		node, id := lingeringNode, "reuse-"+strconv.Itoa(i)
		if i < 2 {
			node = burnNode
		}
		c, err := z.runNode(context.Background(), id, node)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if c.box.cg == nil {
			t.Fatal("the call has no cgroup")
		}
		cg := c.box.cg.Dir()
		out := answer(t, c.output(t))["outputs"].(map[string]any)
		var runner, child int
		if node == lingeringNode {
			runner, child = pidOf(out, "pid"), pidOf(out, "child")
			killLater(t, child)
		}
		u := c.end(t, true)
		gone(t, "after End", runner, child)
		if seen[cg] {
			reused++
		}
		seen[cg] = true
		if node == burnNode {
			if u.CPU < 400*time.Millisecond {
				t.Errorf("call %d burnt half a second of CPU; End says %v", i, u.CPU)
			}
			burntIn[cg] = u.CPU
		} else if before, ok := burntIn[cg]; ok {
			compared++
			if u.CPU >= before {
				t.Errorf("call %d in a cgroup where an earlier call burnt %v reports %v: not only its own", i, before, u.CPU)
			}
		}
	}
	if compared == 0 {
		t.Errorf("no lingering call ran in a burning call's cgroup: %v", seen)
	}
	if reused == 0 {
		t.Errorf("no call's cgroup served a later call: %v", seen)
	}
	z.pool.Close()
	for cg := range seen {
		if fileExists(cg) {
			t.Errorf("%s is left after Pool.Close", cg)
		}
	}
	if log := z.log.String(); !strings.Contains(log, "still running after it was stopped") && !strings.Contains(log, "did not stop within --cancel-grace") {
		t.Errorf("the log does not say the lingering processes were killed:\n%s", log)
	}
}

// A zygote whose --preload started a thread forks no call: a fork keeps
// only the forking thread, and the library whose threads are gone hangs
// or aborts (torch's intra-op pool, numba's OpenMP layer). Its
// environment's spares start cold, and the log says which preload it was.
func TestZygoteNotUsedWhenAPreloadStartsThreads(t *testing.T) {
	t.Parallel()
	if !inContainedChild(t) {
		return
	}
	modules := t.TempDir()
	threader := "import _thread, time\n_thread.start_new_thread(time.sleep, (3600,))\n"
	if err := os.WriteFile(filepath.Join(modules, "threader.py"), []byte(threader), 0o644); err != nil {
		t.Fatal(err)
	}
	// A spare started within changeSlack of its directory's last change
	// counts as stale (warmRig waits the same): let it be older first.
	var st unix.Stat_t
	if err := unix.Stat(modules, &st); err != nil {
		t.Fatal(err)
	}
	for changed := time.Unix(st.Ctim.Unix()); time.Since(changed) <= 2*changeSlack; {
		time.Sleep(changeSlack)
	}
	z := newZygoteRig(t, 1, func(c *Config) {
		c.Preload = []string{"json", "threader"}
		// No __pycache__ written into modules by the first to import
		// threader: it would make the spares started before it stale.
		c.BaseEnv = append(c.BaseEnv, "PYTHONPATH="+modules, "PYTHONDONTWRITEBYTECODE=1")
	})
	first := z.runPID(t, "teach")
	spare := z.waitSpare(t, z.m, first)
	if parent := parentOf(spare); parent != os.Getpid() {
		t.Errorf("the spare %d is the child of %d; want one the worker started cold (%d)", spare, parent, os.Getpid())
	}
	if got := z.runPID(t, "warm"); got != spare {
		t.Errorf("the call ran in %d; want the spare started cold (%d)", got, spare)
	}
	log := z.log.String()
	if !strings.Contains(log, "a --preload module started threads") || !strings.Contains(log, "module=threader") {
		t.Errorf("the log does not say which preload started threads:\n%s", log)
	}
	p := z.pool.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, we := range p.envs {
		if we.zyg != nil {
			t.Errorf("the environment still has a zygote (pid %d)", we.zyg.box.pid)
		}
	}
}
