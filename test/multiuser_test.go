package test

// Workers sharing a machine with other workers of the same user: one
// cgroup, one state directory, one engine's token read from a pipe.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// startedRunner runs a call that announces its runner and then sleeps, and
// returns the call and the runner's pid.
func startedRunner(t *testing.T, wk *enginetest.Worker, id string) (*enginetest.Call, int) {
	t.Helper()
	c := run(t, wk, id, step{"announce": true}, step{"sleep_ms": 60000})
	for {
		m, err := c.Next(timeoutCtx(t, 20*time.Second))
		if err != nil {
			t.Fatalf("call %s: %v", id, err)
		}
		if m.Event == "started" {
			return c, intField(t, m, "pid")
		}
	}
}

// cancelled cancels a running call and checks it is answered as cancelled,
// which a call killed behind the worker's back is not.
func cancelled(t *testing.T, wk *enginetest.Worker, c *enginetest.Call) {
	t.Helper()
	wk.Cancel(c.ID)
	if answer, _ := wait(t, c); answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Errorf("call %s, cancelled, answered %s", c.ID, answer.Raw)
	}
}

// Two workers of one user started from one cgroup (two GPUs, one tmux
// session) each keep to their own subtree: starting the second leaves the
// first one's calls running, and a worker starting later clears what a
// worker killed outright left, and nothing of the worker still running.
func TestTwoWorkersInOneCgroup(t *testing.T) {
	skipUnlessLinux(t)
	t.Parallel()
	cg := delegatedCgroup(t)
	engA, engB, engC := startEngine(t, enginetest.Options{}), startEngine(t, enginetest.Options{}), startEngine(t, enginetest.Options{})

	a := workerInCgroup(t, engA, cg)
	wkA := attach(t, engA)
	if !strings.Contains(a.logs.String(), "containment=cgroup") {
		t.Fatalf("the worker did not take cgroup mode in a cgroup of its own")
	}
	a1, runnerA := startedRunner(t, wkA, "a1")

	workerInCgroup(t, engB, cg)
	wkB := attach(t, engB)
	if answer, _ := wait(t, run(t, wkB, "b1")); !answer.OK {
		t.Fatalf("the second worker's call answered %s", answer.Raw)
	}
	if !platform.ProcessAlive(runnerA) {
		answer, _ := wait(t, a1)
		t.Fatalf("starting a second worker in the same cgroup killed the first one's call; it answered %s", answer.Raw)
	}
	cancelled(t, wkA, a1)

	// A dies outright, leaving a call running in its subtree.
	_, orphan := startedRunner(t, wkA, "a2")
	b2, runnerB := startedRunner(t, wkB, "b2")
	subtreeA := workerSubtree(t, cg, a.cmd.Process.Pid)
	a.signal(syscall.SIGKILL)
	a.wait(10 * time.Second)
	if _, err := os.Stat(subtreeA); err != nil {
		t.Fatalf("the killed worker's subtree: %v", err)
	}

	workerInCgroup(t, engC, cg)
	attach(t, engC)
	eventually(t, 10*time.Second, "the killed worker's call to be stopped", func() bool { return !platform.ProcessAlive(orphan) })
	if _, err := os.Stat(subtreeA); !os.IsNotExist(err) {
		t.Errorf("the killed worker's subtree %s is still there: %v", subtreeA, err)
	}
	if !platform.ProcessAlive(runnerB) {
		t.Fatalf("a third worker starting killed the running worker's call")
	}
	cancelled(t, wkB, b2)
}

// `run --token -` reads the token from standard input, as install does,
// rather than taking "-" for the token.
func TestRunReadsTheTokenFromStandardInput(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	cmd := exec.Command(workerBinary(t), "run", "--url", eng.AttachURL(), "--token", "-",
		"--python", fakeRunnerPath(t), "--runtime", "embedded", "--state-dir", t.TempDir())
	cmd.Env = cleanEnv()
	cmd.Stdin = strings.NewReader(testToken + "\n")
	w := startCommand(t, cmd)
	wk := attach(t, eng)
	if answer, _ := wait(t, run(t, wk, "tok1")); !answer.OK {
		t.Fatalf("a call answered %s", answer.Raw)
	}
	if strings.Contains(w.logs.String(), testToken) {
		t.Errorf("the log shows the token:\n%s", w.logs.String())
	}
}

// memoryCgroupV1 makes a cgroup of the v1 memory controller (hybrid hosts
// keep it there) under this process's own, limited to limitMB, and removes
// it at the end. It skips where there is none or it may not be made.
func memoryCgroupV1(t *testing.T, limitMB int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip(err)
	}
	own := ""
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "memory" {
			own = f[2]
		}
	}
	root := "/sys/fs/cgroup/memory"
	if own == "" || syscall.Access(filepath.Join(root, own), 2) != nil {
		t.Skip("no writable cgroup v1 memory controller here")
	}
	dir := filepath.Join(root, own, fmt.Sprintf("fluksio-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skip("cannot make a memory cgroup here: ", err)
	}
	t.Cleanup(func() {
		eventually(t, 10*time.Second, "the test's memory cgroup to be removable", func() bool { return os.Remove(dir) == nil })
	})
	limit := []byte(strconv.Itoa(limitMB << 20))
	for _, file := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		if err := os.WriteFile(filepath.Join(dir, file), limit, 0); err != nil && file == "memory.limit_in_bytes" {
			t.Skip("cannot limit memory here: ", err)
		}
	}
	return dir
}

// A node that runs out of the memory its cgroup allows is said to have
// been stopped by the OOM killer, because the memory controller counted
// the kill; TestWhyANodeDied (agent/lifecycle_test.go) shows a SIGKILL from elsewhere is not.
// In both containments: with a cgroup v2 per call (cgroup, as root), the
// v1 memory cgroup the runner shares with the worker still counts.
func TestOutOfMemoryIsNamedWhenTheKernelSaysSo(t *testing.T) {
	skipUnlessLinux(t)
	t.Parallel()
	for _, mode := range []string{"subreaper", "cgroup"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			memcg := memoryCgroupV1(t, 96)
			eng := startEngine(t, enginetest.Options{})
			w := startProgram(t, "/bin/sh", []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
				"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, memcg, workerBinary(t), "run",
				"--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
				"--state-dir", t.TempDir(), "--containment", mode, "--warm", "0")
			wk := attach(t, eng)
			eventually(t, 20*time.Second, "the startup log", func() bool { return strings.Contains(w.logs.String(), "containment=") })
			if mode == "cgroup" && !strings.Contains(w.logs.String(), "containment=cgroup") {
				t.Skip("no cgroup per call here (needs root and a writable cgroup v2)")
			}
			answer, _ := wait(t, run(t, wk, "oom", step{"alloc_mb": 512}))
			e := answer.Error
			if answer.OK || e == nil || e.Type != "RemoteError" {
				t.Fatalf("a node over its memory limit answered %s", answer.Raw)
			}
			const want = "the node process stopped: killed by SIGKILL from the kernel's out-of-memory killer"
			if !strings.HasPrefix(e.Message, want) {
				t.Errorf("the answer says %q; want it to begin %q", e.Message, want)
			}
		})
	}
}

// A second worker given the state directory of a running one is refused
// at once, naming the other's pid, and the first one goes on serving.
func TestOneWorkerPerStateDirectory(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	eng := startEngine(t, enginetest.Options{})
	first := startWorker(t, eng, nil, "--state-dir", state)
	wk := attach(t, eng)

	second := startWorker(t, eng, nil, "--state-dir", state)
	if code := second.wait(20 * time.Second); code != 2 {
		t.Errorf("the second worker exited %d; want 2", code)
	}
	want := fmt.Sprintf("in use by another worker (pid %d)", first.cmd.Process.Pid)
	if !strings.Contains(second.logs.String(), want) || !strings.Contains(second.logs.String(), "--state-dir") {
		t.Errorf("the second worker's refusal does not say %q and what to do:\n%s", want, second.logs.String())
	}
	if answer, _ := wait(t, run(t, wk, "after")); !answer.OK {
		t.Errorf("the first worker's call answered %s", answer.Raw)
	}
}

// What a worker killed outright leaves in its state directory (a call's
// directory with what the node wrote there, a partial artifact) is removed
// when the next worker starts with it.
func TestLeftoversOfAKilledWorkerAreRemoved(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--state-dir", state, "--containment", "subreaper")
	wk := attach(t, eng)
	_, runner := startedRunner(t, wk, "killed")
	t.Cleanup(func() { syscall.Kill(runner, syscall.SIGKILL) })
	w.signal(syscall.SIGKILL)
	w.wait(10 * time.Second)
	// The running call's directory, and one made ahead for the next call
	// that starts cold.
	calls, _ := filepath.Glob(filepath.Join(state, "calls", "call-*"))
	if len(calls) == 0 || len(calls) > 2 {
		t.Fatalf("the killed worker's call directories: %v; want the call's (and one made ahead)", calls)
	}
	checkpoint := filepath.Join(calls[0], "checkpoint.pt")
	cache := filepath.Join(state, "artifacts", "sha256")
	if err := os.MkdirAll(cache, 0o700); err != nil {
		t.Fatal(err)
	}
	partial, kept := filepath.Join(cache, ".unpack-12345"), filepath.Join(cache, "0123abcd")
	for _, f := range []string{checkpoint, partial, kept} {
		if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	startWorker(t, eng, nil, "--state-dir", state)
	attach(t, eng)
	for _, f := range append(calls, partial) {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the next worker started: %v", f, err)
		}
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("a cached artifact was removed: %v", err)
	}
}

// --listen on a wildcard address says, at WARN, that the port is open
// beyond this machine; on loopback it says nothing of the kind.
func TestListenBeyondLoopbackWarns(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	for addr, warns := range map[string]bool{"0.0.0.0:0": true, "127.0.0.1:0": false} {
		w := startWorker(t, eng, nil, "--listen", addr, "--log-format", "json")
		attach(t, eng)
		found := false
		for _, rec := range logRecords(w) {
			if rec["level"] == "WARN" && rec["open_to"] != nil {
				found = true
			}
		}
		if found != warns {
			t.Errorf("--listen %s: a warning that the port is open beyond this machine: %v; want %v\n%s", addr, found, warns, w.logs.String())
		}
	}
}
