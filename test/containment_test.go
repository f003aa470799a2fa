package test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// The four helpers the fake runner's "helpers" step starts (see
// test/fakerunner): a plain child, a child that ignores SIGTERM, a
// `setsid -f` daemon and a double-forked daemon that ignores SIGTERM too. The last two leave the
// call's process group, so only the subreaper and the call's cookie can
// find them.
var helperKinds = []string{"plain", "stubborn", "setsid", "daemon"}

// containGrace is the --cancel-grace of these tests; what a call started
// must be gone within it plus containSlack.
const (
	containGrace = time.Second
	containSlack = 3 * time.Second
)

func skipUnlessLinux(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("containment beyond the process group is Linux's (subreaper and cookie)")
	}
}

// markerProcs lists the live helpers whose argv carries marker, by kind.
func markerProcs(marker string) map[string]int {
	found := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) < 3 || !strings.HasPrefix(args[1], "--hold") || !strings.HasPrefix(args[2], marker+"-") {
			continue
		}
		if platform.ProcessAlive(pid) {
			found[strings.TrimPrefix(args[2], marker+"-")] = pid
		}
	}
	return found
}

// statField reads field n (1-based, as in proc(5)) of /proc/pid/stat.
func statField(pid, n int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if n-3 >= len(f) {
		return -1
	}
	v, _ := strconv.Atoi(f[n-3])
	return v
}

func threadsOf(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads in /proc/pid/status")
	return 0
}

// newMarker is unique to a test, and kills what carries it at the end, so
// a failing test leaves nothing running on the machine.
func newMarker(t *testing.T, name string) string {
	marker := fmt.Sprintf("fluksio-contain-%s-%d-%d", name, os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		for _, pid := range markerProcs(marker) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return marker
}

// helpersStarted waits for the call's "helpers" event, then checks that all
// four helpers run, and that the two daemons really left the runner's
// process group.
func helpersStarted(t *testing.T, c *enginetest.Call, marker string) (runner int) {
	t.Helper()
	for {
		m, err := c.Next(timeoutCtx(t, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Event == "started" {
			runner = intField(t, m, "pid")
		}
		if m.Event == "helpers" {
			break
		}
	}
	eventually(t, 10*time.Second, "all four helpers to run", func() bool { return len(markerProcs(marker)) == len(helperKinds) })
	procs := markerProcs(marker)
	for _, kind := range []string{"setsid", "daemon"} {
		if pgid := statField(procs[kind], 5); pgid == runner {
			t.Fatalf("the %s helper is still in the runner's process group %d", kind, runner)
		}
	}
	return runner
}

func noHelperRemains(t *testing.T, marker string, since time.Time) {
	t.Helper()
	deadline := since.Add(containGrace + containSlack)
	for left := markerProcs(marker); len(left) > 0; left = markerProcs(marker) {
		if time.Now().After(deadline) {
			t.Fatalf("helpers outlived their call by more than --cancel-grace + %s: %v", containSlack, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stepsWith(marker string, more ...step) []step {
	steps := []step{{"announce": true}, {"helpers": marker}}
	return append(steps, more...)
}

// containedWorker starts a worker in this containment mode; cgroup mode
// is skipped where the worker cannot make cgroups (not root, no writable
// cgroup v2).
func containedWorker(t *testing.T, eng *enginetest.Engine, mode string, grace time.Duration) *worker {
	t.Helper()
	w := startWorker(t, eng, nil, "--cancel-grace", grace.String(), "--containment", mode)
	want := "containment=subreaper+cookie"
	if mode == "cgroup" {
		want = "containment=cgroup"
	}
	eventually(t, 20*time.Second, "the startup log", func() bool { return strings.Contains(w.logs.String(), "containment=") })
	if !strings.Contains(w.logs.String(), want) {
		if mode == "cgroup" {
			t.Skip("this worker cannot make cgroups here (it needs root or a delegated cgroup v2)")
		}
		t.Fatalf("the startup log does not say %s", want)
	}
	return w
}

// callCgroup is the directory of the cgroup v2 pid runs in.
func callCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			for _, mount := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
				if _, err := os.Stat(mount + "/cgroup.controllers"); err == nil {
					return mount + path
				}
			}
		}
	}
	t.Fatalf("process %d has no cgroup v2", pid)
	return ""
}

// callsCgroupName reports whether name is that of a cgroup a call runs
// in: a call's (call-…, fluksio-call-…), or that of the spare that serves
// it (spare-…), which keeps its name.
func callsCgroupName(name string) bool {
	name = strings.TrimPrefix(name, "fluksio-")
	return strings.HasPrefix(name, "call-") || strings.HasPrefix(name, "spare-")
}

// checkCgroup, in cgroup mode, checks that the runner runs in a cgroup of
// the call's own, and returns a check that the runner is not in it any
// more: it is removed, or kept for a later call (a spare forked since may
// be in it; the call's helpers are looked for by their marker).
func checkCgroup(t *testing.T, mode string, runner int) func() {
	if mode != "cgroup" {
		return func() {}
	}
	dir := callCgroup(t, runner)
	if !callsCgroupName(filepath.Base(dir)) {
		t.Fatalf("the runner runs in %s, not in a call's cgroup", dir)
	}
	return func() {
		eventually(t, 5*time.Second, "the call's cgroup to be removed or to hold its runner no more", func() bool {
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return os.IsNotExist(err) || (err == nil && !slices.Contains(strings.Fields(string(b)), strconv.Itoa(runner)))
		})
	}
}

func TestNothingACallStartsOutlivesIt(t *testing.T) {
	skipUnlessLinux(t)
	for _, mode := range []string{"subreaper", "cgroup"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testContainment(t, mode)
		})
	}
}

func testContainment(t *testing.T, mode string) {
	t.Run("answered", func(t *testing.T) {
		t.Parallel()
		marker := newMarker(t, "answered")
		eng := startEngine(t, enginetest.Options{})
		w := containedWorker(t, eng, mode, containGrace)
		wk := attach(t, eng)
		c := run(t, wk, "a1", stepsWith(marker, step{"sleep_ms": 1500})...)
		runner := helpersStarted(t, c, marker)
		gone := checkCgroup(t, mode, runner)
		// The OOM killer is to prefer node code over the worker.
		for _, pid := range append([]int{runner}, mapValues(markerProcs(marker))...) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); strings.TrimSpace(string(b)) != "500" {
				t.Errorf("process %d of the call has oom_score_adj %q, want 500", pid, b)
			}
		}
		answer, _ := wait(t, c)
		if !answer.OK {
			t.Fatalf("answered %s", answer.Raw)
		}
		noHelperRemains(t, marker, time.Now())
		gone()
		eventually(t, 5*time.Second, "no zombie children of the worker", func() bool { return len(zombiesOf(w.cmd.Process.Pid)) == 0 })
		eventually(t, 5*time.Second, "the call's end record", func() bool { return strings.Contains(w.logs.String(), `msg="call ended"`) })
		for _, field := range []string{"outcome=ok", "duration_ms=", "cpu_ms=", "peak_rss_mb="} {
			if !strings.Contains(w.logs.String(), field) {
				t.Errorf("the call's end record lacks %s", field)
			}
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		t.Parallel()
		marker := newMarker(t, "cancelled")
		eng := startEngine(t, enginetest.Options{})
		w := containedWorker(t, eng, mode, containGrace)
		wk := attach(t, eng)
		c := run(t, wk, "c1", stepsWith(marker, step{"sleep_ms": 60000})...)
		gone := checkCgroup(t, mode, helpersStarted(t, c, marker))
		start := time.Now()
		wk.Cancel("c1")
		answer, _ := wait(t, c)
		if answer.Error == nil || answer.Error.Type != "NodeCancelled" {
			t.Fatalf("cancel answered %s", answer.Raw)
		}
		noHelperRemains(t, marker, start)
		gone()
		eventually(t, 5*time.Second, "no zombie children of the worker", func() bool { return len(zombiesOf(w.cmd.Process.Pid)) == 0 })
	})
	t.Run("connection-dropped", func(t *testing.T) {
		t.Parallel()
		marker := newMarker(t, "dropped")
		eng := startEngine(t, enginetest.Options{})
		w := containedWorker(t, eng, mode, containGrace)
		wk := attach(t, eng)
		c := run(t, wk, "d1", stepsWith(marker, step{"sleep_ms": 60000})...)
		gone := checkCgroup(t, mode, helpersStarted(t, c, marker))
		start := time.Now()
		wk.Drop()
		noHelperRemains(t, marker, start)
		gone()
		eventually(t, 5*time.Second, "no zombie children of the worker", func() bool { return len(zombiesOf(w.cmd.Process.Pid)) == 0 })
	})
	t.Run("worker-sigterm", func(t *testing.T) {
		t.Parallel()
		marker := newMarker(t, "sigterm")
		eng := startEngine(t, enginetest.Options{})
		w := containedWorker(t, eng, mode, containGrace)
		wk := attach(t, eng)
		c := run(t, wk, "s1", stepsWith(marker, step{"sleep_ms": 60000})...)
		runner := helpersStarted(t, c, marker)
		gone := checkCgroup(t, mode, runner)
		start := time.Now()
		w.signal(syscall.SIGTERM)
		answer, _ := wait(t, c)
		if answer.Error == nil || answer.Error.Message != "the worker is stopping" {
			t.Errorf("answered %s", answer.Raw)
		}
		if code := w.wait(20 * time.Second); code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
		noHelperRemains(t, marker, start)
		gone()
	})
}

// A worker told twice to stop kills its calls at once, helpers included.
// One killed outright cannot; in cgroup mode the next worker started
// removes what it left.
func TestStoppedAtOnceOrKilled(t *testing.T) {
	skipUnlessLinux(t)
	for _, mode := range []string{"subreaper", "cgroup"} {
		t.Run(mode+"/second-signal", func(t *testing.T) {
			t.Parallel()
			marker := newMarker(t, "twice")
			eng := startEngine(t, enginetest.Options{})
			w := containedWorker(t, eng, mode, time.Minute)
			wk := attach(t, eng)
			c := run(t, wk, "k1", stepsWith(marker, step{"sleep_ms": 60000})...)
			gone := checkCgroup(t, mode, helpersStarted(t, c, marker))
			start := time.Now()
			w.signal(syscall.SIGTERM)
			time.Sleep(200 * time.Millisecond)
			w.signal(syscall.SIGTERM)
			w.wait(10 * time.Second)
			// Well within the minute of --cancel-grace.
			noHelperRemains(t, marker, start)
			if mode == "cgroup" {
				// The worker exits at once; the next one removes the cgroup.
				startWorker(t, eng, nil, "--containment", "cgroup")
				attach(t, eng)
				gone()
			}
		})
	}
	t.Run("cgroup/worker-killed", func(t *testing.T) {
		t.Parallel()
		marker := newMarker(t, "killed")
		eng := startEngine(t, enginetest.Options{})
		w := containedWorker(t, eng, "cgroup", time.Second)
		wk := attach(t, eng)
		c := run(t, wk, "x1", stepsWith(marker, step{"sleep_ms": 60000})...)
		gone := checkCgroup(t, "cgroup", helpersStarted(t, c, marker))
		w.signal(syscall.SIGKILL)
		w.wait(10 * time.Second)
		if len(markerProcs(marker)) == 0 {
			t.Fatal("the helpers died with the worker; this test shows nothing")
		}
		start := time.Now()
		startWorker(t, eng, nil, "--containment", "cgroup")
		attach(t, eng)
		noHelperRemains(t, marker, start)
		gone()
	})
}

func TestTenContainedCallsLeaveTheWorkerAsBefore(t *testing.T) {
	skipUnlessLinux(t)
	for _, mode := range []string{"subreaper", "cgroup"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testTenContainedCalls(t, mode)
		})
	}
}

func testTenContainedCalls(t *testing.T, mode string) {
	eng := startEngine(t, enginetest.Options{})
	w := containedWorker(t, eng, mode, 300*time.Millisecond)
	wk := attach(t, eng)
	pid := w.cmd.Process.Pid
	var cgroups []string // in cgroup mode, each call's
	call := func(i int) {
		marker := newMarker(t, fmt.Sprintf("ten%d", i))
		c := run(t, wk, fmt.Sprintf("ten-%d", i), stepsWith(marker, step{"sleep_ms": 1000})...)
		runner := helpersStarted(t, c, marker)
		if mode == "cgroup" {
			cgroups = append(cgroups, callCgroup(t, runner))
		}
		if answer, _ := wait(t, c); !answer.OK {
			t.Fatalf("call %d answered %s", i, answer.Raw)
		}
		eventually(t, 5*time.Second, "the call's helpers to be gone", func() bool { return len(markerProcs(marker)) == 0 })
	}
	// workerCgroups counts this worker's calls' cgroups (named alike):
	// those kept for later calls and the one made ahead for the next cold
	// start.
	workerCgroups := func() int {
		if len(cgroups) == 0 {
			return 0
		}
		name := filepath.Base(cgroups[0])
		all, _ := filepath.Glob(filepath.Join(filepath.Dir(cgroups[0]), name[:strings.LastIndexByte(name, '-')+1]+"*"))
		return len(all)
	}
	call(0)
	eventually(t, 5*time.Second, "the first call's processes to be reaped", func() bool { return len(childrenOf(pid))+len(zombiesOf(pid)) == 0 })
	fds, threads := ownFDs(t, pid), threadsOf(t, pid)
	for i := 1; i <= 10; i++ {
		call(i)
	}
	eventually(t, 5*time.Second, "every process of the ten calls to be reaped", func() bool {
		if kids, zs := childrenOf(pid), zombiesOf(pid); len(kids)+len(zs) > 0 {
			t.Logf("children %v, zombies %v", kids, zs)
			return false
		}
		return true
	})
	// One call at a time: what is left of the calls' cgroups is the one
	// made ahead and the one kept for reuse (those whose leftovers were
	// killed with cgroup.kill are removed).
	eventually(t, 5*time.Second, "the calls' cgroups to be reused or removed", func() bool { return workerCgroups() <= 2 })
	// A call's pipes close once its processes are gone, a moment after.
	var now int
	eventually(t, 5*time.Second, "the ten calls' descriptors to be closed", func() bool {
		now = ownFDs(t, pid)
		return now <= fds
	})
	// Go's runtime may add a thread for a blocking system call now and
	// then; a leak would add at least one a call.
	if now := threadsOf(t, pid); now > threads+3 {
		t.Errorf("threads grew over ten calls: %d, then %d", threads, now)
	}
}

// ownFDs counts pid's open descriptors but those of what it keeps for
// later calls, bounded on their own: the calls' cgroups' files and the
// call directories it lists (one of something removed still counts).
func ownFDs(t *testing.T, pid int) int {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		kept := (strings.HasPrefix(target, "/sys/fs/cgroup/") || strings.Contains(target, "/calls/call-")) && !strings.HasSuffix(target, " (deleted)")
		if !kept {
			n++
		}
	}
	return n
}

func mapValues(m map[string]int) []int {
	var vs []int
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}

// A worker in a cgroup delegated to it (a systemd service with
// Delegate=yes) moves itself into a leaf, as cgroup v2 requires of a
// cgroup whose children have controllers, and makes each call's cgroup
// next to it. Simulated here, as root, with a cgroup the test makes.
func TestDelegatedCgroup(t *testing.T) {
	skipUnlessLinux(t)
	t.Parallel()
	delegated := delegatedCgroup(t)
	marker := newMarker(t, "delegated")
	eng := startEngine(t, enginetest.Options{})
	w := workerInCgroup(t, eng, delegated)
	wk := attach(t, eng)
	if !strings.Contains(w.logs.String(), "containment=cgroup") {
		t.Fatalf("the worker did not take cgroup mode in a delegated cgroup")
	}
	subtree := workerSubtree(t, delegated, w.cmd.Process.Pid)
	if got := callCgroup(t, w.cmd.Process.Pid); got != filepath.Join(subtree, "worker") {
		t.Errorf("the worker runs in %s, want the leaf %s/worker", got, subtree)
	}
	c := run(t, wk, "del1", stepsWith(marker, step{"sleep_ms": 60000})...)
	runner := helpersStarted(t, c, marker)
	if got := callCgroup(t, runner); filepath.Dir(got) != subtree || !callsCgroupName(filepath.Base(got)) {
		t.Fatalf("the runner runs in %s, want a call's cgroup in %s", got, subtree)
	}
	gone := checkCgroup(t, "cgroup", runner)
	start := time.Now()
	wk.Cancel("del1")
	if answer, _ := wait(t, c); answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Fatalf("cancel answered %s", answer.Raw)
	}
	noHelperRemains(t, marker, start)
	gone()
}

// workerSubtree is the subtree the worker pid makes in cgroup cg:
// worker-PID.NSINO, its pid and its PID namespace's inode.
func workerSubtree(t *testing.T, cg string, pid int) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &st); err != nil {
		t.Fatalf("the worker's PID namespace: %v", err)
	}
	return filepath.Join(cg, fmt.Sprintf("worker-%d.%d", pid, st.Ino))
}

// delegatedCgroup makes a cgroup v2 for the test, as systemd makes one for
// a service with Delegate=yes or a user's scope, and removes it with
// whatever is left in it at the end. It skips where that is not allowed.
func delegatedCgroup(t *testing.T) string {
	t.Helper()
	mount := ""
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(m + "/cgroup.controllers"); err == nil {
			mount = m
			break
		}
	}
	if mount == "" || syscall.Access(mount, 2) != nil {
		t.Skip("no writable cgroup v2 hierarchy here (the test needs root)")
	}
	delegated := filepath.Join(mount, fmt.Sprintf("fluksio-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(delegated, 0o755); err != nil {
		t.Skip("cannot make a cgroup here: ", err)
	}
	t.Cleanup(func() {
		var dirs []string
		filepath.WalkDir(delegated, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs) // the deepest first
		for _, d := range dirs {
			os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0)
		}
		eventually(t, 5*time.Second, "the test's cgroups to be removable", func() bool {
			for _, d := range dirs {
				os.Remove(d)
			}
			_, err := os.Stat(delegated)
			return os.IsNotExist(err)
		})
	})
	return delegated
}

// workerInCgroup starts a worker in cgroup cg: a shell puts itself there,
// then becomes the worker.
func workerInCgroup(t *testing.T, eng *enginetest.Engine, cg string, args ...string) *worker {
	t.Helper()
	return startProgram(t, "/bin/sh", []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
		append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg, workerBinary(t), "run",
			"--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
			"--state-dir", t.TempDir(), "--log-level", "debug", "--cancel-grace", "1s", "--containment", "cgroup"}, args...)...)
}

// BenchmarkContainedCall measures a call's round trip (start, answer, stop
// and sweep) in each containment mode, one call at a time.
func BenchmarkContainedCall(b *testing.B) {
	for _, mode := range []string{"subreaper", "cgroup"} {
		b.Run(mode, func(b *testing.B) {
			eng := startEngine(b, enginetest.Options{})
			w := startWorker(b, eng, nil, "--containment", mode, "--log-level", "info")
			wk := attach(b, eng)
			want := map[string]string{"subreaper": "subreaper+cookie", "cgroup": "cgroup"}[mode]
			if !strings.Contains(w.logs.String(), "containment="+want) {
				b.Skip("containment " + mode + " is not available here")
			}
			wait(b, run(b, wk, "warm"))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if answer, _ := wait(b, run(b, wk, "b"+strconv.Itoa(i))); !answer.OK {
					b.Fatal(string(answer.Raw))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/call")
		})
	}
}
