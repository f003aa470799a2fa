package test

// Warm runners (--warm, --preload) with a real Python: a call handed a
// spare sees nothing of earlier calls, gets its own environment, runs the
// code a cold start would, and spares leave nothing behind however the
// worker ends. Each test first makes sure spares serve its calls (the hit
// counter), so none passes by running cold.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// warmWorker starts the binary with a real Python, metrics on, and args
// (--warm N among them).
func warmWorker(t *testing.T, extraEnv []string, args ...string) (*enginetest.Engine, *enginetest.Worker, *worker, string) {
	t.Helper()
	eng := startEngine(t, enginetest.Options{})
	state := t.TempDir()
	base := []string{"run",
		"--url", eng.AttachURL(),
		"--python", runtimePython(t),
		"--runtime", "embedded",
		"--state-dir", state,
		"--log-level", "debug",
		"--listen", "127.0.0.1:0",
	}
	env := append([]string{"FLUKSIO_WORKER_TOKEN=" + testToken, "FLUKSIO_ARTIFACT_CACHE=" + t.TempDir()}, extraEnv...)
	w := startBinary(t, env, append(base, args...)...)
	stopAtCleanup(w)
	wk := attach(t, eng)
	return eng, wk, w, state
}

// warmState reads the spare gauge and the hit and miss counters.
func warmState(t *testing.T, addr string) (spares, hits, misses int) {
	t.Helper()
	s := scrape(t, addr)
	return int(s.value(t, "fluksio_worker_warm_runners")),
		int(s.value(t, "fluksio_worker_warm_runner_hits_total")),
		int(s.value(t, "fluksio_worker_warm_runner_misses_total"))
}

func waitSpares(t *testing.T, addr string, n int) {
	t.Helper()
	eventually(t, 60*time.Second, fmt.Sprintf("%d spare runners", n), func() bool {
		spares, _, _ := warmState(t, addr)
		return spares >= n
	})
}

// runWarm runs one call and fails the test unless it answered ok.
func runWarm(t *testing.T, wk *enginetest.Worker, req map[string]any) map[string]any {
	t.Helper()
	out, _ := runNode(t, wk, req)
	if out["ok"] != true {
		t.Fatalf("call %v failed: %v", req["call_id"], out)
	}
	outputs, _ := out["outputs"].(map[string]any)
	return outputs
}

const probeNode = `import builtins, os, signal
from fluksio import Port, node

@node(provides=[Port("seen", "json")])
def probe():
    seen = {
        "global": getattr(builtins, "fluksio_test_marker", None),
        "env": os.environ.get("FLUKSIO_TEST_MARKER"),
        "handler": signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL,
        "pid": os.getpid(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "call_dir": os.environ.get("FLUKSIO_CALL_DIR"),
        "numpy_loaded": "numpy" in __import__("sys").modules,
    }
    builtins.fluksio_test_marker = "set"
    os.environ["FLUKSIO_TEST_MARKER"] = "set"
    signal.signal(signal.SIGUSR1, lambda *a: None)
    return seen
`

func probe(t *testing.T, wk *enginetest.Worker, id string, env map[string]any) map[string]any {
	t.Helper()
	req := nodeRun(id, probeNode, "probe", nil)
	if env != nil {
		req["env"] = env
	}
	seen, _ := runWarm(t, wk, req)["seen"].(map[string]any)
	// The answer comes before the runner exits: a test that looks at the
	// worker's children next must not count it as a spare.
	if pid, _ := seen["pid"].(float64); pid > 0 {
		eventually(t, 30*time.Second, "the runner of call "+id+" to exit", func() bool { return !platform.ProcessAlive(int(pid)) })
	}
	return seen
}

func TestWarmIsolation(t *testing.T) {
	_, wk, w, _ := warmWorker(t, nil, "--warm", "1")
	addr := monitorAddr(t, w)
	pids := map[float64]bool{}
	for i := 0; i < 4; i++ {
		if i > 0 {
			waitSpares(t, addr, 1)
		}
		seen := probe(t, wk, "iso"+strconv.Itoa(i), nil)
		if seen["global"] != nil || seen["env"] != nil || seen["handler"] != false {
			t.Errorf("call %d saw what an earlier call left: %v", i, seen)
		}
		pid, _ := seen["pid"].(float64)
		if pids[pid] {
			t.Errorf("call %d ran in pid %v, which an earlier call used", i, pid)
		}
		pids[pid] = true
	}
	if _, hits, misses := warmState(t, addr); hits != 3 || misses != 1 {
		t.Errorf("hits %d, misses %d; want 3 calls served by spares after the first started cold", hits, misses)
	}
}

func TestWarmPerCallEnvironment(t *testing.T) {
	if exec := runtimePython(t); exec != "" {
		if err := runPython(exec, "-c", "import numpy"); err != nil {
			t.Skip("numpy is not installed for", exec)
		}
	}
	_, wk, w, _ := warmWorker(t, []string{"CUDA_VISIBLE_DEVICES=2,3"}, "--warm", "4", "--preload", "numpy")
	addr := monitorAddr(t, w)
	// Teach both environments, then alternate between them: each call
	// gets a spare of its own environment, with numpy already loaded.
	envs := []map[string]any{
		{"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0"},
		{"OMP_NUM_THREADS": 3, "CUDA_VISIBLE_DEVICES": "1"},
	}
	want := []struct{ omp, cuda string }{{"1", "2"}, {"3", "3"}}
	for i := 0; i < 6; i++ {
		k := i % 2
		if i >= 2 {
			// A spare for each environment; where they are forked from
			// zygotes, each keeps one more.
			n := 2
			if len(zygotePids(w)) > 0 {
				n = 4
			}
			waitSpares(t, addr, n)
		}
		seen := probe(t, wk, "env"+strconv.Itoa(i), envs[k])
		if seen["omp"] != want[k].omp || seen["cuda"] != want[k].cuda {
			t.Errorf("call %d: OMP_NUM_THREADS=%v CUDA_VISIBLE_DEVICES=%v; want %s and %s", i, seen["omp"], seen["cuda"], want[k].omp, want[k].cuda)
		}
		if i >= 2 && seen["numpy_loaded"] != true {
			t.Errorf("call %d: numpy was not preloaded in its spare", i)
		}
	}
	if _, hits, _ := warmState(t, addr); hits != 4 {
		t.Errorf("%d calls were served by spares; want the 4 after each environment's first", hits)
	}
}

func runPython(python string, args ...string) error {
	return exec.Command(python, args...).Run()
}

// TestWarmFreshness: code that changes between calls runs new in the next
// call, whether a spare would have held the old one (a preloaded package
// rewritten in place, or replaced whole) or not (a module node).
func TestWarmFreshness(t *testing.T) {
	lib := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		path := filepath.Join(lib, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		// In place, as an editor that keeps the inode writes: only the
		// file changes, not its directory.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(text)
		f.Close()
	}
	write("warmpkg/__init__.py", "VERSION = 1\n")
	write("warmnode.py", "from fluksio import Port, node\nimport warmpkg\n\n@node(provides=[Port('v', 'json')])\ndef version():\n    return {'node': 1, 'pkg': warmpkg.VERSION}\n")
	// Python reuses a compiled module while its source's modification time,
	// in whole seconds, and size are unchanged, and VERSION = 1 and
	// VERSION = 2 are the same size: the first files are dated in the past,
	// so a rewrite within the same second as them is still seen as new.
	past := time.Now().Add(-time.Minute)
	for _, rel := range []string{"warmpkg/__init__.py", "warmnode.py"} {
		if err := os.Chtimes(filepath.Join(lib, rel), past, past); err != nil {
			t.Fatal(err)
		}
	}
	// Compiled ahead, as pip installs packages: a __pycache__ directory
	// made while a spare starts changes a directory the spare watches,
	// and that spare is (rightly) not used.
	if err := runPython(runtimePython(t), "-m", "compileall", "-q", lib); err != nil {
		t.Fatal(err)
	}
	// An earlier sys.path entry, empty at first: a module made there
	// shadows the package.
	first := t.TempDir()
	_, wk, w, _ := warmWorker(t, []string{"PYTHONPATH=" + first + ":" + lib}, "--warm", "1", "--preload", "warmpkg")
	addr := monitorAddr(t, w)
	call := func(id string) map[string]any {
		t.Helper()
		waitSpares(t, addr, 1)
		req := map[string]any{"op": "run", "call_id": id, "node": map[string]any{"module": "warmnode"},
			"function": "version", "inputs": map[string]any{}, "settings": map[string]any{}}
		v, _ := runWarm(t, wk, req)["v"].(map[string]any)
		return v
	}
	runWarm(t, wk, map[string]any{"op": "run", "call_id": "teach", "node": map[string]any{"module": "warmnode"},
		"function": "version", "inputs": map[string]any{}, "settings": map[string]any{}})

	if v := call("same"); v["node"] != 1.0 || v["pkg"] != 1.0 {
		t.Fatalf("first warm call: %v", v)
	}
	_, hitsBefore, _ := warmState(t, addr)
	if hitsBefore != 1 {
		t.Fatalf("%d hits; the call after the first should have had a spare", hitsBefore)
	}

	waitSpares(t, addr, 1)
	write("warmnode.py", "from fluksio import Port, node\nimport warmpkg\n\n@node(provides=[Port('v', 'json')])\ndef version():\n    return {'node': 2, 'pkg': warmpkg.VERSION}\n")
	if v := call("node-changed"); v["node"] != 2.0 {
		t.Errorf("after the module node changed, the call ran %v; want node 2", v)
	}

	waitSpares(t, addr, 1)
	write("warmpkg/__init__.py", "VERSION = 2\n")
	if v := call("pkg-rewritten"); v["pkg"] != 2.0 {
		t.Errorf("after the preloaded package was rewritten in place, the call ran %v; want pkg 2", v)
	}

	// An upgrade as pip does it: the old package removed, a new one put
	// in its place.
	waitSpares(t, addr, 1)
	if err := os.RemoveAll(filepath.Join(lib, "warmpkg")); err != nil {
		t.Fatal(err)
	}
	write("warmpkg/__init__.py", "VERSION = 3\n")
	if v := call("pkg-upgraded"); v["pkg"] != 3.0 {
		t.Errorf("after the preloaded package was upgraded, the call ran %v; want pkg 3", v)
	}

	waitSpares(t, addr, 1)
	if err := os.WriteFile(filepath.Join(first, "warmpkg.py"), []byte("VERSION = 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v := call("pkg-shadowed"); v["pkg"] != 4.0 {
		t.Errorf("after a module that shadows the preloaded package was made, the call ran %v; want pkg 4", v)
	}
}

// sparePids lists the worker's live children started as spares or
// zygotes, and the zygotes' children: the spares forked from them. (A
// call's runner may still be exiting after its answer: atexit handlers
// run; one forked from a zygote shows the zygote's command line.)
func sparePids(w *worker) []int {
	var pids []int
	for _, pid := range childrenOf(w.cmd.Process.Pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "--fluksio-spare") || strings.Contains(string(cmdline), "--fluksio-zygote") {
			pids = append(pids, pid)
		}
		if strings.Contains(string(cmdline), "--fluksio-zygote") {
			pids = append(pids, childrenOf(pid)...)
		}
	}
	return pids
}

// leftBehind fails the test if a pid is still alive or a call directory
// remains in the state directory.
func leftBehind(t *testing.T, pids []int, state string) {
	t.Helper()
	for _, pid := range pids {
		if platform.ProcessAlive(pid) {
			t.Errorf("spare runner %d outlived the worker", pid)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(state, "calls"))
	for _, e := range entries {
		t.Errorf("call directory %s was left behind", e.Name())
	}
	// Every runner's argv names the runtime in the state directory.
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmdline), state) {
			pid, _ := strconv.Atoi(e.Name())
			if platform.ProcessAlive(pid) {
				t.Errorf("runner %s outlived the worker: %q", e.Name(), cmdline)
			}
		}
	}
}

func TestWarmSpareKilledWhileWaiting(t *testing.T) {
	_, wk, w, _ := warmWorker(t, nil, "--warm", "1")
	addr := monitorAddr(t, w)
	probe(t, wk, "teach", nil)
	waitSpares(t, addr, 1)
	// Its one spare; where calls fork from a zygote, the zygote and two
	// forked spares (one for the one slot, one ahead).
	if len(zygotePids(w)) > 0 {
		waitSpares(t, addr, 2)
	}
	before := sparePids(w)
	if len(before) == 0 || len(before) > 3 {
		t.Fatalf("the worker has warm children %v; want its one spare (or its zygote and two forks)", before)
	}
	for _, pid := range before {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	eventually(t, 60*time.Second, "new warm runners in place of the killed ones", func() bool {
		now := sparePids(w)
		return len(now) == len(before) && !slices.ContainsFunc(now, func(pid int) bool { return slices.Contains(before, pid) })
	})
	waitSpares(t, addr, 1)
	seen := probe(t, wk, "after", nil)
	if pid, _ := seen["pid"].(float64); slices.Contains(before, int(pid)) {
		t.Errorf("the call ran in a killed spare")
	}
	if _, hits, _ := warmState(t, addr); hits != 1 {
		t.Errorf("%d hits; the call after the kill should have had the new spare", hits)
	}
}

// TestWarmSparesEndWithTheWorker: however the worker ends, its spares and
// their call directories go with it; while the engine is away, they stay.
func TestWarmSparesEndWithTheWorker(t *testing.T) {
	for _, how := range []string{"sigterm", "starting", "drain", "idle", "disconnect", "reload"} {
		t.Run(how, func(t *testing.T) {
			args := []string{"--warm", "2"}
			if how == "idle" {
				args = append(args, "--max-idle", "2")
			}
			eng, wk, w, state := warmWorker(t, nil, args...)
			addr := monitorAddr(t, w)
			probe(t, wk, "teach", nil)
			if how == "starting" {
				// Stopped while its spares may still be starting.
				w.signal(syscall.SIGTERM)
				if code := w.wait(60 * time.Second); code != 0 {
					t.Fatalf("the worker exited %d", code)
				}
				leftBehind(t, nil, state)
				return
			}
			waitSpares(t, addr, 1)
			pids := sparePids(w)
			if len(pids) == 0 {
				t.Fatal("no spare runner is running")
			}
			switch how {
			case "sigterm":
				w.signal(syscall.SIGTERM)
			case "drain":
				w.signal(syscall.SIGQUIT)
			case "idle": // spares are not calls: the worker goes idle
			case "reload":
				// The binary executed again keeps the pid: the old
				// spares must be gone before it, not orphaned by it.
				w.signal(syscall.SIGHUP)
				attach(t, eng)
				for _, pid := range pids {
					if platform.ProcessAlive(pid) {
						t.Errorf("spare %d outlived the reload", pid)
					}
				}
				w.signal(syscall.SIGTERM)
			case "disconnect":
				eng.DropAll()
				wk = attach(t, eng)
				for _, pid := range pids {
					if !platform.ProcessAlive(pid) {
						t.Errorf("spare %d was stopped with the connection; spares are kept while the engine is away", pid)
					}
				}
				probe(t, wk, "after", nil)
				if _, hits, _ := warmState(t, addr); hits != 1 {
					t.Errorf("%d hits; the call after reconnecting should have had a spare", hits)
				}
				pids = append(pids, sparePids(w)...)
				w.signal(syscall.SIGTERM)
			}
			if code := w.wait(60 * time.Second); code != 0 {
				t.Fatalf("the worker exited %d", code)
			}
			leftBehind(t, pids, state)
		})
	}
}

// TestWarmZero: --warm 0 starts no process before its call.
func TestWarmZero(t *testing.T) {
	_, wk, w, state := warmWorker(t, nil, "--warm", "0")
	addr := monitorAddr(t, w)
	a := probe(t, wk, "one", nil)
	b := probe(t, wk, "two", nil)
	if a["pid"] == b["pid"] {
		t.Errorf("two calls ran in one process")
	}
	eventually(t, 30*time.Second, "no children once the calls' runners exited", func() bool {
		return len(childrenOf(w.cmd.Process.Pid)) == 0
	})
	if spares, hits, misses := warmState(t, addr); spares+hits+misses != 0 {
		t.Errorf("with --warm 0: %d spares, %d hits, %d misses; want none", spares, hits, misses)
	}
	w.signal(syscall.SIGTERM)
	w.wait(60 * time.Second)
	leftBehind(t, nil, state)
}

// TestRunnersRunTheCompiledRuntime: a call's runner, started cold, as a
// spare or forked from a zygote, runs the runtime compiled for its Python
// (no compile of the runtime's source at each start, and a zygote without
// the C heap the parser leaves), and the node's traceback still shows the
// node's frames only.
func TestRunnersRunTheCompiledRuntime(t *testing.T) {
	node := "import os\nfrom fluksio import Port, node\n@node(provides=[Port('y', 'str')])\n" +
		"def f(fail=False):\n    if fail:\n        raise ValueError('boom')\n" +
		"    return open('/proc/self/cmdline', 'rb').read().split(b'\\0')[1].decode()\n"
	for _, warm := range []string{"0", "1"} {
		t.Run("warm="+warm, func(t *testing.T) {
			_, wk, w, state := warmWorker(t, nil, "--warm", warm)
			if warm != "0" {
				probe(t, wk, "teach", nil)
				waitSpares(t, monitorAddr(t, w), 1)
			}
			out, _ := runNode(t, wk, nodeRun("c1", node, "f", nil))
			outputs, _ := out["outputs"].(map[string]any)
			script, _ := outputs["y"].(string)
			if dir := filepath.Join(state, "runtime", "__pycache__"); filepath.Dir(script) != dir || !strings.HasSuffix(script, ".pyc") {
				t.Errorf("the runner ran %q, want the compiled runtime in %s (answer %v)", script, dir, out)
			}
			out, _ = runNode(t, wk, nodeRun("c2", node, "f", map[string]any{"fail": true}))
			errObj, _ := out["error"].(map[string]any)
			if tb, _ := errObj["traceback"].(string); !strings.Contains(tb, `File "pipeline.py", line 6, in f`) || strings.Contains(tb, "runtime") {
				t.Errorf("traceback %q: want the node's frame only", tb)
			}
		})
	}
}
