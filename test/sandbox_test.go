package test

// The sandbox, tried from inside real nodes as a careless or hostile node
// would: through the real binary, the embedded runtime and Debian's
// Python, with the worker as root and as an unprivileged user.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// sandboxProbeNode tries each thing the sandbox forbids and says what happened.
const sandboxProbeNode = `
import glob, json, os, signal, sys

def probe(state_dir, token_file, worker_pid, tag):
    out = {}
    def attempt(name, fn):
        try:
            out[name] = "done: %s" % (fn(),)
        except Exception as exc:
            out[name] = "refused: %s" % type(exc).__name__
    mine = os.environ["FLUKSIO_CALL_DIR"]
    calls = os.path.dirname(mine)
    attempt("list_calls", lambda: sorted(os.listdir(calls)))
    def neighbours():
        found = [p for p in glob.glob(os.path.join(calls, "*", "neighbour-*")) if not p.startswith(mine + "/")]
        return [open(p).read() for p in found] or "none found"
    attempt("read_neighbour", neighbours)
    with open(os.path.join(mine, "neighbour-" + tag), "w") as f:
        f.write("secret of " + tag)
    attempt("write_state", lambda: open(os.path.join(state_dir, "planted"), "w").write("x"))
    runtime = [p for p in glob.glob(os.path.join(state_dir, "runtime", "**"), recursive=True) if os.path.isfile(p)]
    attempt("runtime_files_seen", lambda: len(runtime))
    def rewrite_runtime():
        target = sys.argv[0]
        with open(target, "ab") as f:
            f.write(b"planted")
        return target
    attempt("write_runtime", rewrite_runtime)
    attempt("plant_beside_runtime", lambda: open(os.path.join(os.path.dirname(sys.argv[0]), "json.py"), "w").write("raise SystemExit"))
    attempt("read_token", lambda: open(token_file).read().strip() or "empty")
    def cgroup_write():
        wrote = []
        for line in open("/proc/self/cgroup"):
            _, ctrl, path = line.strip().split(":", 2)
            base = "/sys/fs/cgroup/" + (ctrl.replace("name=", "") if ctrl else "unified")
            for f in ("memory.limit_in_bytes", "memory.max", "pids.max"):
                p = base + path + "/" + f
                if os.path.exists(p):
                    with open(p, "w") as fh:
                        fh.write("-1" if f.endswith("bytes") else "max")
                    wrote.append(p)
            parent = base + os.path.dirname(path) + "/cgroup.procs"
            if os.path.exists(parent) and path != "/":
                with open(parent, "w") as fh:
                    fh.write(str(os.getpid()))
                wrote.append(parent)
        return wrote or "nothing found"
    attempt("write_cgroup", cgroup_write)
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        attempt("leave_" + d.replace("/", "_"), lambda d=d: open(os.path.join(d, "left-" + tag), "w").write("x" * 1000))
    attempt("signal_worker", lambda: os.kill(int(worker_pid), 0))
    return {"report": json.dumps(out)}
`

// sandboxReport runs the probe as call id on wk and returns its report.
func sandboxReport(t *testing.T, wk *enginetest.Worker, id, stateDir, tokenFile string, workerPID int) map[string]string {
	t.Helper()
	answer, _ := runNode(t, wk, nodeRun(id, sandboxProbeNode, "probe", map[string]any{
		"state_dir": stateDir, "token_file": tokenFile, "worker_pid": workerPID, "tag": id,
	}))
	if answer["ok"] != true {
		t.Fatalf("the probe node failed: %v", answer)
	}
	outs, _ := answer["outputs"].(map[string]any)
	var report map[string]string
	if err := json.Unmarshal([]byte(outs["report"].(string)), &report); err != nil {
		t.Fatalf("the probe's report: %v (%v)", err, answer)
	}
	return report
}

// sandboxedWorker starts the worker with --parallel 2 and per-call limits
// on Debian's Python, as uid (0: root), with extra args.
func sandboxedWorker(t *testing.T, uid int, args ...string) (wk *enginetest.Worker, w *worker, stateDir, tokenFile string) {
	t.Helper()
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("needs Debian's /usr/bin/python3")
	}
	eng := startEngine(t, enginetest.Options{})
	// Not under /tmp, which every sandbox replaces: the token's file must
	// be hidden by its own mount, as /etc/fluksio-worker's is.
	base, err := os.MkdirTemp(".", ".sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	base, _ = filepath.Abs(base)
	t.Cleanup(func() { os.RemoveAll(base) })
	stateDir = filepath.Join(base, "state")
	tokenFile = filepath.Join(base, "token")
	os.Mkdir(stateDir, 0o700)
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{base, stateDir, tokenFile} {
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	bin := workerBinary(t)
	if uid != 0 {
		// Where that user may run it from: the build's directory is root's.
		bin = filepath.Join(base, "fluksio-worker")
		copyFile(t, workerBinary(t), bin)
	}
	cmd := exec.Command(bin, append([]string{"run",
		"--url", eng.AttachURL(), "--token-file", tokenFile, "--python", python, "--runtime", "embedded",
		"--state-dir", stateDir, "--parallel", "2", "--log-level", "debug", "--sandbox", "on"}, args...)...)
	cmd.Env = append(cleanEnv(), "HOME="+stateDir)
	cmd.Dir = "/"
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	w = startCommand(t, cmd)
	stopAtCleanup(w)
	return attach(t, eng), w, stateDir, tokenFile
}

// TestSandboxHoldsFromInsideANode: a node cannot read a neighbour call's
// files, write the state directory or the runtime, read the token, write
// its cgroup's limits or leave its cgroup, leave files in /tmp, /var/tmp
// or /dev/shm, or signal the worker; as root and as another user.
func TestSandboxHoldsFromInsideANode(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the worker runs as root and as another user")
	}
	for _, who := range []struct {
		name string
		uid  int
	}{{"root", 0}, {"unprivileged", 65534}} {
		t.Run(who.name, func(t *testing.T) {
			wk, w, stateDir, tokenFile := sandboxedWorker(t, who.uid)
			pid := w.cmd.Process.Pid
			first := sandboxReport(t, wk, "first", stateDir, tokenFile, pid)
			second := sandboxReport(t, wk, "second", stateDir, tokenFile, pid)
			for name, r := range map[string]map[string]string{"first": first, "second": second} {
				for _, key := range []string{"read_neighbour", "write_state", "write_runtime", "plant_beside_runtime", "read_token",
					"leave__tmp", "leave__var_tmp", "leave__dev_shm", "signal_worker", "write_cgroup"} {
					got := r[key]
					switch key {
					case "read_neighbour":
						if got != "done: none found" {
							t.Errorf("%s call, %s: %s", name, key, got)
						}
					case "read_token":
						if strings.Contains(got, testToken) {
							t.Errorf("%s call read the token: %s", name, got)
						}
					case "write_cgroup":
						if strings.HasPrefix(got, "done: [") {
							t.Errorf("%s call wrote its cgroup: %s", name, got)
						}
					case "leave__tmp", "leave__var_tmp", "leave__dev_shm":
						if !strings.HasPrefix(got, "done") {
							t.Errorf("%s call could not use its private %s: %s", name, key, got)
						}
					default:
						if !strings.HasPrefix(got, "refused") {
							t.Errorf("%s call, %s: %s", name, key, got)
						}
					}
				}
				if got := r["list_calls"]; strings.Count(got, "call-") > 1 {
					t.Errorf("%s call lists other calls' directories: %s", name, got)
				}
			}
			for _, p := range []string{"/tmp/left-first", "/var/tmp/left-first", "/dev/shm/left-first", "/tmp/left-second", "/dev/shm/left-second"} {
				if _, err := os.Stat(p); err == nil {
					os.Remove(p)
					t.Errorf("%s outlived its call", p)
				}
			}
			if _, err := os.Stat(filepath.Join(stateDir, "planted")); err == nil {
				t.Error("a node planted a file in the state directory")
			}
			// The runtime each later runner executes is still the worker's.
			if answer, _ := runNode(t, wk, nodeRun("after", "def f():\n    return {'ok': 1}\n", "f", nil)); answer["ok"] != true {
				t.Errorf("a call after the probes: %v", answer)
			}
			if w.cmd.ProcessState != nil {
				t.Errorf("the worker exited: %v", w.cmd.ProcessState)
			}
		})
	}
}

// TestNoSandboxUnderAPolicyRefusesToStart: where no sandbox can be had
// (user namespaces off, here in a user namespace of the test's own whose
// user.max_user_namespaces is 0), a worker with a code policy refuses to
// start, exit 2, saying why and what to change; --sandbox off in so many
// words starts it, saying calls run without one; --sandbox on refuses
// whatever the policy.
func TestNoSandboxUnderAPolicyRefusesToStart(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	if exec.Command("unshare", "--user", "--map-root-user", "true").Run() != nil {
		t.Skip("no user namespaces here to take away")
	}
	eng := startEngine(t, enginetest.Options{})
	start := func(args ...string) *worker {
		cmd := exec.Command("unshare", append([]string{"--user", "--map-root-user", "sh", "-c",
			`echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"`, "sh", workerBinary(t), "run",
			"--url", eng.AttachURL(), "--python", "/usr/bin/python3", "--runtime", "embedded", "--state-dir", t.TempDir()}, args...)...)
		cmd.Env = append(cleanEnv(), "FLUKSIO_WORKER_TOKEN="+testToken)
		return startCommand(t, cmd)
	}
	for _, args := range [][]string{{"--allow-module", "acme.*"}, {"--sandbox", "on"}} {
		w := start(args...)
		if code := w.wait(60 * time.Second); code != 2 {
			t.Errorf("%v without a sandbox: exit %d, want 2\n%s", args, code, w.logs.String())
		}
		if log := w.logs.String(); !strings.Contains(log, "sandbox=\"off: ") || !strings.Contains(log, "user namespaces") {
			t.Errorf("%v: the refusal does not say why and what to change:\n%s", args, log)
		}
	}
	w := start("--allow-module", "acme.*", "--sandbox", "off")
	attach(t, eng)
	if log := w.logs.String(); !strings.Contains(log, `sandbox="off: --sandbox off"`) {
		t.Errorf("--sandbox off: the start does not say calls run without a sandbox:\n%s", log)
	}
}
