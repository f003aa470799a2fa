package test

// Zygotes (issue 24): where calls have cgroups, a warm runner is forked
// from an interpreter that loaded the runtime and the preloads once. To
// node code a forked runner must be what a cold start is; its random
// state must be its own; the zygote must never touch CUDA; and a zygote
// killed is replaced while calls start cold.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// needZygotes skips where the worker would use spares, not zygotes: no
// cgroup the worker may write.
func needZygotes(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 || platform.ProbeCgroups() != nil {
		t.Skip("zygotes need a cgroup per call (root with a writable cgroup v2)")
	}
}

// zygotePids lists the worker's zygotes: of its warm children, those that
// hold the control socket (fd 4; a forked runner has a pipe there).
func zygotePids(w *worker) []int {
	var pids []int
	// The worker's own children only: a runner just forked from a zygote
	// holds its socket at fd 4 too, until it takes its call's descriptors.
	for _, pid := range childrenOf(w.cmd.Process.Pid) {
		if target, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/4"); strings.HasPrefix(target, "socket:") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// fingerprintNode reports what a node can see of its process, with the
// per-call values (the call directory, the cookie) masked.
const fingerprintNode = `import os, re, resource, signal, sys, threading, random
from fluksio import Port, node

@node(provides=[Port("fp", "json"), Port("forked", "json"), Port("draw", "json")])
def fingerprint():
    call_dir = os.environ["FLUKSIO_CALL_DIR"]
    cgroup = [line for line in open("/proc/self/cgroup").read().splitlines() if line.startswith("0::")][0]
    def mask(s):
        s = s.replace(call_dir, "CALLDIR")
        return re.sub(r"fluksio-(sdk|code)-[^/:]+", r"fluksio-\1-X", s)
    env = {k: mask(v) for k, v in os.environ.items() if k not in ("FLUKSIO_CALL_COOKIE",)}
    env["FLUKSIO_CALL_DIR"] = "CALLDIR"
    fds = {}
    for fd in sorted(os.listdir("/proc/self/fd")):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        fds[fd] = re.sub(r"\[\d+\]", "", mask(target)) + ("" if os.get_inheritable(int(fd)) else " cloexec")
    signals = {}
    for sig in signal.Signals:
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        h = signal.getsignal(sig)
        signals[sig.name] = h if isinstance(h, int) else getattr(h, "__qualname__", repr(type(h)))
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
    umask = os.umask(0o22); os.umask(umask)
    with open("/proc/self/oom_score_adj") as f:
        oom = f.read().strip()
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    fp = {
        "argv": [mask(a) for a in sys.argv],
        "path": [mask(p) for p in sys.path],
        "env": env,
        "cwd": mask(os.getcwd()),
        "fds": fds,
        "signals": signals,
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "limits": limits,
        "umask": umask,
        "oom": oom,
        "threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": status["Threads"].strip(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "sid": os.getsid(0) == os.getsid(os.getppid()),
        "stdio": [type(sys.stdout).__name__, sys.stdout.line_buffering, sys.stdout.name, type(sys.stderr).__name__, sys.stderr.name],
        "stdin": os.read(0, 10).decode(),
        "cgroup": re.sub(r"/[^/]*$", "/X", cgroup),
        "numpy": "numpy" in sys.modules,
    }
    # Who else is in the call's cgroup while it runs: nobody, its own.
    procs = []
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            with open(mount + cgroup[3:] + "/cgroup.procs") as f:
                procs = [int(p) for p in f.read().split()]
            break
        except OSError:
            pass
    forked = [cgroup, os.getpid(), procs] if "--fluksio-zygote" in open("/proc/self/cmdline").read() else []
    draw = [random.random()]
    if "numpy" in sys.modules:
        import numpy
        draw.append(float(numpy.random.random()))
        draw.append(float(numpy.random.default_rng().random()))
    return {"fp": fp, "forked": forked, "draw": draw}
`

// fingerprint runs fingerprintNode; forked says whether it ran forked
// from a zygote, and then the call checks its cgroup is its own: neither
// the worker's nor a zygote's, no process but the runner in it while the
// call ran. (After the call a spare may be in it: an emptied cgroup serves
// a later one.)
func fingerprint(t *testing.T, wk *enginetest.Worker, w *worker, id string) (fp map[string]any, forked bool, draw []any) {
	t.Helper()
	out := runWarm(t, wk, nodeRun(id, fingerprintNode, "fingerprint", nil))
	fp, _ = out["fp"].(map[string]any)
	cg, _ := out["forked"].([]any)
	draw, _ = out["draw"].([]any)
	if len(cg) == 3 {
		if procs, _ := cg[2].([]any); len(procs) != 1 || procs[0] != cg[1] {
			t.Errorf("call %s ran in a cgroup (%s) that held %v while it ran; want only its runner %v", id, cg[0], procs, cg[1])
		}
		data, _ := os.ReadFile("/proc/" + strconv.Itoa(w.cmd.Process.Pid) + "/cgroup")
		for _, line := range strings.Split(string(data), "\n") {
			if line != "" && line == cg[0] {
				t.Errorf("call %s ran in the worker's cgroup (%s), not its own", id, line)
			}
		}
	}
	return fp, len(cg) == 3, draw
}

// TestZygoteFingerprint: a call forked from a zygote sees the process a
// cold start gives it (argv, sys.path, environment, cwd, descriptors,
// signals and mask, rlimits, umask, oom_score_adj, threads, stdio, its own
// process group and cgroup), with numpy preloaded and without; and its
// random draws, Python's and numpy's, differ from the previous call's.
func TestZygoteFingerprint(t *testing.T) {
	needZygotes(t)
	for _, preload := range []string{"", "numpy"} {
		t.Run("preload="+preload, func(t *testing.T) {
			t.Parallel()
			if preload != "" {
				if err := runPython(runtimePython(t), "-c", "import numpy"); err != nil {
					t.Skip("numpy is not installed")
				}
			}
			warm := []string{"--warm", "1"}
			if preload != "" {
				warm = append(warm, "--preload", preload)
			}
			_, wk, w, _ := warmWorker(t, nil, warm...)
			addr := monitorAddr(t, w)
			// The first call starts cold, and teaches the environment.
			want, forked, _ := fingerprint(t, wk, w, "cold")
			if forked {
				t.Fatal("the first call ran forked")
			}
			var draws [][]any
			for i := 0; i < 3; i++ {
				waitSpares(t, addr, 1)
				got, forked, draw := fingerprint(t, wk, w, "forked"+strconv.Itoa(i))
				if !forked {
					t.Fatalf("call %d did not run forked from a zygote", i)
				}
				if preload != "" {
					// numpy preloaded is loaded in the call; its OpenBLAS
					// pool is started again on first use, so the thread
					// count is the only difference a cold start has.
					if got["numpy"] != true {
						t.Errorf("numpy was preloaded but not loaded in the forked call")
					}
					got["numpy"], got["os_threads"] = want["numpy"], want["os_threads"]
				}
				if !reflect.DeepEqual(got, want) {
					a, _ := json.MarshalIndent(want, "", " ")
					b, _ := json.MarshalIndent(got, "", " ")
					t.Errorf("call %d forked from a zygote differs from a cold start:\ncold:   %s\nforked: %s", i, a, b)
				}
				draws = append(draws, draw)
			}
			for i := 1; i < len(draws); i++ {
				for j := range draws[i] {
					if j < len(draws[i-1]) && draws[i][j] == draws[i-1][j] {
						t.Errorf("calls %d and %d drew the same random number (generator %d): %v", i-1, i, j, draws[i][j])
					}
				}
			}
			if preload != "" && len(draws[0]) != 3 {
				t.Errorf("draws %v: numpy's were not taken", draws[0])
			}
		})
	}
}

// TestZygoteNeverInitializesCUDA: a preload that would touch CUDA at
// import is not what this checks (importing numpy or torch does not); the
// zygote runs no node code, so a node that initializes "CUDA" (a fake
// library, recorded by pid) does it in its own forked process only.
func TestZygoteNeverInitializesCUDA(t *testing.T) {
	needZygotes(t)
	lib := t.TempDir()
	record := filepath.Join(t.TempDir(), "inits")
	// fakecuda records every process that initializes it; the preload
	// imports it (as torch's import loads libcuda without initializing).
	os.WriteFile(filepath.Join(lib, "fakecuda.py"), []byte(`import os
def init():
    with open(os.environ["FAKECUDA_RECORD"], "a") as f:
        f.write("%d\n" % os.getpid())
`), 0o644)
	node := `import os
import fakecuda
from fluksio import Port, node

@node(provides=[Port("pid", "json")])
def gpu():
    fakecuda.init()
    return os.getpid()
`
	_, wk, w, _ := warmWorker(t, []string{"PYTHONPATH=" + lib, "FAKECUDA_RECORD=" + record}, "--warm", "1", "--preload", "fakecuda",
		"--sandbox-bind", lib+","+filepath.Dir(record)+":rw")
	addr := monitorAddr(t, w)
	runWarm(t, wk, nodeRun("teach", node, "gpu", nil))
	waitSpares(t, addr, 1)
	zygotes := zygotePids(w)
	runWarm(t, wk, nodeRun("forked", node, "gpu", nil))
	data, _ := os.ReadFile(record)
	var inits []int
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		inits = append(inits, pid)
	}
	for _, pid := range inits {
		for _, z := range zygotes {
			if pid == z {
				t.Errorf("the zygote %d initialized the fake CUDA", z)
			}
		}
	}
	if len(inits) != 2 {
		t.Errorf("%d initializations recorded (%v); want one per call", len(inits), inits)
	}
	if _, hits, _ := warmState(t, addr); hits != 1 {
		t.Errorf("%d hits; the second call should have been forked", hits)
	}
}

// TestZygoteReplaced: a zygote killed between calls, or one that stops
// (SIGSTOP: it neither reaps its runners nor answers a fork), is replaced;
// calls meanwhile answer (forked from a spare made before or from the new
// zygote, or cold); the calls after are forked from the new zygote; and
// nothing of a forked call outlives the worker.
func TestZygoteReplaced(t *testing.T) {
	needZygotes(t)
	for _, how := range []string{"killed", "wedged"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			_, wk, w, state := warmWorker(t, nil, "--warm", "1")
			addr := monitorAddr(t, w)
			fingerprint(t, wk, w, "teach")
			waitSpares(t, addr, 1)
			before := zygotePids(w)
			if len(before) != 1 {
				t.Fatalf("the worker has zygotes %v; want one", before)
			}
			if how == "killed" {
				syscall.Kill(before[0], syscall.SIGKILL)
				fingerprint(t, wk, w, "right-after")
			} else {
				syscall.Kill(before[0], syscall.SIGSTOP)
				// Its spares killed: the stopped zygote does not report
				// their exits (it is replaced for that), and the next
				// spare is asked of it (it is replaced when the fork
				// times out), whichever comes first.
				var killed []int
				for _, pid := range sparePids(w) {
					if pid != before[0] {
						syscall.Kill(pid, syscall.SIGKILL)
						killed = append(killed, pid)
					}
				}
				eventually(t, 60*time.Second, "the killed spares to exit", func() bool {
					return !slices.ContainsFunc(killed, platform.ProcessAlive)
				})
				fingerprint(t, wk, w, "while-wedged")
			}
			eventually(t, 60*time.Second, "a new zygote in place of the old one", func() bool {
				now := zygotePids(w)
				return len(now) == 1 && now[0] != before[0]
			})
			waitSpares(t, addr, 1)
			if _, forked, _ := fingerprint(t, wk, w, "after"); !forked {
				t.Errorf("the call after the new zygote was ready did not run forked")
			}
			pids := append(before, sparePids(w)...)
			w.signal(syscall.SIGTERM)
			if code := w.wait(60 * time.Second); code != 0 {
				t.Fatalf("the worker exited %d", code)
			}
			leftBehind(t, pids, state)
		})
	}
}

// TestNoZygoteWithoutCgroups: where calls are found by their cookie
// (--containment subreaper), spares are interpreters started one by one: a
// forked runner would show its zygote's environment in /proc, without the
// call's cookie.
func TestNoZygoteWithoutCgroups(t *testing.T) {
	_, wk, w, _ := warmWorker(t, nil, "--warm", "1", "--containment", "subreaper")
	addr := monitorAddr(t, w)
	fingerprint(t, wk, w, "teach")
	waitSpares(t, addr, 1)
	if _, forked, _ := fingerprint(t, wk, w, "spare"); forked {
		t.Errorf("a call ran forked from a zygote with --containment subreaper")
	}
	if _, hits, _ := warmState(t, addr); hits != 1 {
		t.Errorf("%d hits; the second call should have had a spare", hits)
	}
	if z := zygotePids(w); len(z) != 0 {
		t.Errorf("zygotes %v run with --containment subreaper", z)
	}
}
