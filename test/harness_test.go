// Package test holds the tests that need the whole worker: the real binary,
// a real fake engine on a loopback socket (agent/enginetest), real runner
// processes.
package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// The binaries the tests run are built on first use, once per test
// binary, so a test that needs neither (or only one) does not wait for
// both: workerBinary, fakeRunnerPath, releaseWorkerBin.
var (
	binDirOnce                                 = sync.OnceValues(func() (string, error) { return os.MkdirTemp("", "fluksio-worker-test-") })
	workerBuild, fakeRunnerBuild, releaseBuild build
)

const testToken = "tok-3f9a-secret-7c1d"

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := binDirOnce(); err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// build is one binary built with `go build` the first time a test asks.
type build struct {
	once sync.Once
	path string
	err  error
}

// get builds pkg into name with extra build flags and env, once, and
// returns its path; a failed build fails every test that asks.
func (b *build) get(t testing.TB, name, pkg string, env []string, flags ...string) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := binDirOnce()
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		cmd := exec.Command("go", append(append([]string{"build", "-o", b.path}, flags...), pkg)...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// workerBinary is the fluksio-worker under test, built with the race
// detector when the tests are.
func workerBinary(t testing.TB) string {
	t.Helper()
	var flags []string
	if raceEnabled {
		flags = append(flags, "-race")
	}
	return workerBuild.get(t, "fluksio-worker", "github.com/fluksio/fluksio-worker", nil, flags...)
}

// fakeRunnerPath is a compiled stand-in for Python and the runtime
// (test/fakerunner), what --python points at in most tests.
func fakeRunnerPath(t testing.TB) string {
	t.Helper()
	return fakeRunnerBuild.get(t, "fakerunner", "github.com/fluksio/fluksio-worker/test/fakerunner", nil)
}

// releaseWorkerBin is the worker built as releases are (static, stripped,
// without the race detector, as .goreleaser.yaml builds it), for
// measurements of its speed, memory and threads.
func releaseWorkerBin(t testing.TB) string {
	t.Helper()
	return releaseBuild.get(t, "fluksio-worker-release", "github.com/fluksio/fluksio-worker",
		[]string{"CGO_ENABLED=0"}, "-trimpath", "-ldflags=-s -w")
}

// worker is a running fluksio-worker process.
type worker struct {
	t      testing.TB
	cmd    *exec.Cmd
	logs   *enginetest.Buffer
	exited chan struct{}
	err    error
}

// startWorker runs the binary against eng with the fake runner as Python
// and the token in the environment. Extra args come last, so they win.
func startWorker(t testing.TB, eng *enginetest.Engine, extraEnv []string, args ...string) *worker {
	t.Helper()
	base := []string{
		"run",
		"--url", eng.AttachURL(),
		"--python", fakeRunnerPath(t),
		"--runtime", "embedded",
		"--state-dir", t.TempDir(),
		"--log-level", "debug",
	}
	return startBinary(t, append([]string{"FLUKSIO_WORKER_TOKEN=" + testToken}, extraEnv...), append(base, args...)...)
}

func startBinary(t testing.TB, env []string, args ...string) *worker {
	t.Helper()
	return startProgram(t, workerBinary(t), env, args...)
}

// startProgram runs a program with a clean environment plus env, collects
// its output, and kills it at the end of the test if it is still running.
func startProgram(t testing.TB, program string, env []string, args ...string) *worker {
	t.Helper()
	cmd := exec.Command(program, args...)
	cmd.Env = append(cleanEnv(), env...)
	return startCommand(t, cmd)
}

// startCommand starts cmd as startProgram does, with the directory and
// environment it was given.
func startCommand(t testing.TB, cmd *exec.Cmd) *worker {
	t.Helper()
	w := &worker{t: t, cmd: cmd, logs: &enginetest.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr, cmd.Stdout = w.logs, w.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		w.err = cmd.Wait()
		close(w.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			cmd.Process.Kill()
			<-w.exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(cmd.Path), w.logs.String())
		}
	})
	return w
}

// stopAtCleanup has w stopped as a service manager stops it, before the
// directories made before it are removed (cleanups run last first). A
// worker with spares killed outright leaves them to notice alone: until
// they do, a runner may still write its code cache after its answer or a
// spare rehearse in its call directory, and the directories' removal
// fails ("directory not empty").
func stopAtCleanup(w *worker) {
	w.t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			w.cmd.Process.Signal(syscall.SIGTERM)
			w.wait(60 * time.Second)
		}
	})
}

// cleanEnv is this process's environment without anything that would
// change the worker's inventory or configuration behind a test's back.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SLURM_") || strings.HasPrefix(name, "FLUKSIO_") || name == "CUDA_VISIBLE_DEVICES" || name == "STATE_DIRECTORY" {
			continue
		}
		env = append(env, kv)
	}
	// The suite runs with --warm 0, as today's worker did: the fake runner
	// stands in for Python and does not know spare mode. Spares are tested
	// with a real Python in warm_test.go, whose --warm flags win over this.
	return append(env, "FLUKSIO_WORKER_WARM=0")
}

// wait returns the exit code, failing the test after timeout.
func (w *worker) wait(timeout time.Duration) int {
	w.t.Helper()
	select {
	case <-w.exited:
	case <-time.After(timeout):
		w.t.Fatalf("the worker did not exit within %s", timeout)
	}
	if w.err == nil {
		return 0
	}
	if ee, ok := w.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	w.t.Fatal(w.err)
	return -1
}

func (w *worker) signal(sig syscall.Signal) {
	w.t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		w.t.Fatal(err)
	}
}

// attach waits for the worker's connection.
func attach(t testing.TB, eng *enginetest.Engine) *enginetest.Worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wk, err := eng.NextWorker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return wk
}

func startEngine(t testing.TB, opts enginetest.Options) *enginetest.Engine {
	t.Helper()
	if opts.Tokens == nil {
		opts.Tokens = []string{testToken}
	}
	eng, err := enginetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	return eng
}

// run sends a fake-runner request with these steps and returns its call.
func run(t testing.TB, wk *enginetest.Worker, id string, steps ...map[string]any) *enginetest.Call {
	t.Helper()
	req := map[string]any{"call_id": id, "steps": steps}
	c, err := wk.Run(req)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func wait(t testing.TB, c *enginetest.Call) (enginetest.Message, []enginetest.Message) {
	t.Helper()
	answer, events, err := c.WaitTimeout(60 * time.Second)
	if err != nil {
		t.Fatalf("call %s: %v", c.ID, err)
	}
	return answer, events
}

type step = map[string]any

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// intField reads a number from a decoded JSON object.
func intField(t testing.TB, m enginetest.Message, path ...string) int {
	t.Helper()
	var v any
	if err := m.Decode(&v); err != nil {
		t.Fatal(err)
	}
	for _, p := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("no %v in %s", path, m.Raw)
		}
		v = obj[p]
	}
	n, ok := v.(float64)
	if !ok {
		t.Fatalf("%v in %s is not a number", path, m.Raw)
	}
	return int(n)
}

func timeoutCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func rawOf(ms []enginetest.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Raw)
	}
	return out
}

func openFDs(t testing.TB, pid int) int {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// childrenOf lists the live (not zombie) child processes of pid.
func childrenOf(pid int) []int { return processesOf(pid, false) }

// zombiesOf lists the unreaped children of pid.
func zombiesOf(pid int) []int { return processesOf(pid, true) }

// processesOf lists the children of pid that are zombies, or that are not.
func processesOf(pid int, zombies bool) []int {
	var kids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// After the command's name: state, parent pid, process group, ...
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && (fields[0] == "Z") == zombies && fields[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return kids
}
