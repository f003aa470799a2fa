package test

// Node code written the way machine-learning engineers write it, through
// the real binary, the embedded runtime and every Python 3.8+ on this
// machine: fork pools stopped early, checkpoints in finally blocks, loaded
// artifacts edited in place, spawn and forkserver pools, threads printing
// unbuffered, directories saved as artifacts, relative paths under a
// service's working directory.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// runtimePythons lists the interpreters these tests run nodes on, the way
// test/all.sh finds them: $FLUKSIO_TEST_PYTHON alone when set, else
// /usr/bin/python3, python3 on PATH and every pyenv 3.x, each interpreter
// once and only 3.8 or newer. Each is named by its version.
func runtimePythons(t *testing.T) map[string]string {
	t.Helper()
	candidates := []string{os.Getenv("FLUKSIO_TEST_PYTHON")}
	if candidates[0] == "" {
		candidates = []string{"/usr/bin/python3"}
		if p, err := exec.LookPath("python3"); err == nil {
			candidates = append(candidates, p)
		}
		root := os.Getenv("PYENV_ROOT")
		if root == "" {
			home, _ := os.UserHomeDir()
			root = filepath.Join(home, ".pyenv")
		}
		found, _ := filepath.Glob(filepath.Join(root, "versions", "3.*", "bin", "python3"))
		candidates = append(candidates, found...)
	}
	pythons := map[string]string{}
	seen := map[string]bool{}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		out, err := exec.Command(p, "-c", "import os, platform, sys; assert sys.version_info >= (3, 8); print(os.path.realpath(sys.executable), platform.python_version())").Output()
		if err != nil {
			continue
		}
		real, version, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
		if seen[real] {
			continue
		}
		seen[real] = true
		name := "py" + version
		if pythons[name] != "" {
			name += "-" + filepath.Base(filepath.Dir(filepath.Dir(real)))
		}
		pythons[name] = p
	}
	if len(pythons) == 0 {
		t.Skip("no Python 3.8+ to run nodes on")
	}
	return pythons
}

// forEachPython runs f once per interpreter, one after the other (the
// machine is shared; the tests themselves run in parallel).
func forEachPython(t *testing.T, f func(t *testing.T, python string)) {
	t.Helper()
	pythons := runtimePythons(t)
	names := make([]string, 0, len(pythons))
	for name := range pythons {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) { f(t, pythons[name]) })
	}
}

// nodeWorker starts the binary on one Python with the embedded runtime; env
// and args are added to the defaults (later args win).
func nodeWorker(t *testing.T, python string, dir string, env []string, args ...string) (*enginetest.Engine, *enginetest.Worker, *worker) {
	t.Helper()
	eng := startEngine(t, enginetest.Options{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{
		"run",
		"--url", eng.AttachURL(),
		"--token-file", tokenFile,
		"--python", python,
		"--runtime", "embedded",
		"--state-dir", t.TempDir(),
		"--log-level", "debug",
	}
	cmd := append(base, args...)
	w := startBinaryIn(t, dir, env, cmd...)
	// Stopped before its state directory goes: a runner killed with the
	// worker may still write its code cache after its answer.
	stopAtCleanup(w)
	return eng, attach(t, eng), w
}

// startBinaryIn is startBinary with a working directory ("" for the test's).
func startBinaryIn(t *testing.T, dir string, env []string, args ...string) *worker {
	t.Helper()
	if dir == "" {
		return startBinary(t, env, args...)
	}
	cmd := exec.Command(workerBinary(t), args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	return startCommand(t, cmd)
}

// noCancelInLogs fails if the node's log shows a cancel nobody sent.
func noCancelInLogs(t *testing.T, events []enginetest.Message) {
	t.Helper()
	for _, line := range logLines(decodeEvents(t, events)) {
		if strings.Contains(line, "NodeCancelled") {
			t.Errorf("a log line shows a cancel nobody sent: %q", line)
			return
		}
	}
}

// Item 1: a fork pool's terminate() sends its workers SIGTERM; that must
// neither cancel the call nor let a forked worker write on the protocol.
func TestRuntimeNodesForkPools(t *testing.T) {
	t.Parallel()
	code := `
import multiprocessing as mp, os, time

def square(x):
    return x * x

def plain_map(rounds):
    total = 0
    for _ in range(rounds):
        with mp.get_context("fork").Pool(2) as pool:
            total += sum(pool.map(square, range(8)))
    time.sleep(1.2)  # longer than the old runtime's grace: a stray cancel answers here
    return {"total": total, "pid": os.getpid()}

def forked_child_returns():
    # A child that falls back into the runtime must not answer for the call.
    pid = os.fork()
    if pid == 0:
        return {"who": "child"}
    os.waitpid(pid, 0)
    return {"who": "parent"}
`
	const rounds = 60
	forEachPython(t, func(t *testing.T, python string) {
		_, wk, _ := nodeWorker(t, python, "", nil)
		// Each pool's exit is its terminate(), which sends its workers
		// SIGTERM. (Not stopped with an imap iterator open: CPython itself
		// then hangs in terminate() now and then, with or without this
		// runtime, measured with a plain script and no worker: 3.8 about
		// one pool in 200, 3.11 one in 1,000, 3.12.1 two in 4,800, 3.13.0
		// two in 2,400.)
		answer, events := runNode(t, wk, nodeRun("map", code, "plain_map", map[string]any{"rounds": rounds}))
		if out := outputsOf(t, answer); out["total"] != float64(rounds*140) {
			t.Errorf("plain map: %v", out)
		}
		noCancelInLogs(t, events)

		answer, _ = runNode(t, wk, nodeRun("fork", code, "forked_child_returns", nil))
		if out := outputsOf(t, answer); out["who"] != "parent" {
			t.Errorf("the call was answered by %v, want the runner itself", out["who"])
		}
		if m, err := wk.Stray(timeoutCtx(t, 300*time.Millisecond)); err == nil {
			t.Errorf("a frame after the answers: %s", m.Raw)
		}
	})
}

// Item 2: a node cleaning up after a cancel gets the worker's
// --cancel-grace, and the runtime still answers before the SIGKILL.
func TestRuntimeNodesCancelGrace(t *testing.T) {
	t.Parallel()
	code := `
import time
from fluksio import Port, node, save_artifact

@node(provides=[Port("step", "int", stream=True), Port("final", "float")])
def train(tag, cleanup):
    try:
        yield {"step": 0}
        while True:
            time.sleep(0.05)
    finally:
        time.sleep(cleanup)
        ref = save_artifact(("checkpoint " + tag).encode())
        print("checkpoint saved", ref["digest"])
`
	forEachPython(t, func(t *testing.T, python string) {
		eng, wk, _ := nodeWorker(t, python, "", nil, "--cancel-grace", "4s")
		cancelAfterStart := func(id string, cleanup float64) (map[string]any, time.Duration) {
			t.Helper()
			c := startNode(t, wk, nodeRun(id, code, "train", map[string]any{"tag": id + python, "cleanup": cleanup}))
			for {
				m, err := c.Next(timeoutCtx(t, 30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if m.Event == "stream" {
					break
				}
			}
			sent := time.Now()
			if err := wk.Cancel(id); err != nil {
				t.Fatal(err)
			}
			answer, _ := wait(t, c)
			var out map[string]any
			answer.Decode(&out)
			return out, time.Since(sent)
		}

		out, took := cancelAfterStart("ckpt", 1.5)
		nodeError(t, out, "NodeCancelled", "the call was cancelled")
		if msg := out["error"].(map[string]any)["message"]; strings.Contains(msg.(string), "did not stop") {
			t.Errorf("a 1.5 s cleanup within a 4 s grace was cut: %v", msg)
		}
		if _, ok := eng.Artifact(sha256Digest([]byte("checkpoint ckpt" + python))); !ok {
			t.Errorf("the checkpoint saved in finally (1.5 s, grace 4 s) never reached the store (answered after %s)", took)
		}

		// A cleanup longer than the grace: the runtime answers for it once
		// the grace is over, before the worker's SIGKILL.
		out, took = cancelAfterStart("slow", 30)
		nodeError(t, out, "NodeCancelled", "did not stop in time")
		// Not before the grace; and not the cleanup's own 30 s.
		if took < 3500*time.Millisecond || took > 20*time.Second {
			t.Errorf("the runtime gave up on the cleanup after %s, want about the 4 s grace", took)
		}
	})
}

// Item 3: what load_artifact hands out is always the digest's content, and
// the cache it comes from is private.
func TestRuntimeNodesLoadedArtifactsStayTrue(t *testing.T) {
	t.Parallel()
	code := `
import hashlib, os, stat
from fluksio import load_artifact

def edit(digest):
    path = load_artifact(digest)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    try:
        with open(path, "r+b") as f:
            f.write(b"fine-tuned in place")
        how = "written"
    except PermissionError:
        try:
            os.chmod(path, 0o644)  # a node set on it gets there anyway
        except OSError:
            return {"mode": mode, "how": "refused"}  # the worker's cache, read-only in a sandbox
        with open(path, "r+b") as f:
            f.write(b"fine-tuned in place")
        how = "chmod then written"
    return {"mode": mode, "how": how}

def read(digest):
    with open(load_artifact(digest), "rb") as f:
        data = f.read()
    cache = os.environ["FLUKSIO_ARTIFACT_CACHE"]
    return {"sha": "sha256:" + hashlib.sha256(data).hexdigest(), "cache_mode": stat.S_IMODE(os.stat(cache).st_mode)}
`
	forEachPython(t, func(t *testing.T, python string) {
		cache := filepath.Join(t.TempDir(), "cache")
		eng, wk, _ := nodeWorker(t, python, "", []string{"FLUKSIO_ARTIFACT_CACHE=" + cache})
		digest := eng.PutArtifact(bytes.Repeat([]byte("weights "+python), 4096))

		answer, _ := runNode(t, wk, nodeRun("read-1", code, "read", map[string]any{"digest": digest}))
		out := outputsOf(t, answer)
		if out["sha"] != digest {
			t.Fatalf("first load: %v", out)
		}
		if out["cache_mode"] != float64(0o700) {
			t.Errorf("the artifact cache has mode %o, want 0700", int(out["cache_mode"].(float64)))
		}
		answer, _ = runNode(t, wk, nodeRun("edit", code, "edit", map[string]any{"digest": digest}))
		out = outputsOf(t, answer)
		if out["mode"] != float64(0o444) {
			t.Errorf("load_artifact handed out a file of mode %o, want read-only 0444", int(out["mode"].(float64)))
		}
		t.Logf("a node editing a loaded artifact: %v", out["how"])
		for i := 0; i < 2; i++ {
			answer, _ = runNode(t, wk, nodeRun(fmt.Sprintf("read-%d", i+2), code, "read", map[string]any{"digest": digest}))
			if got := outputsOf(t, answer)["sha"]; got != digest {
				t.Fatalf("after another call edited the loaded file, a load gave %v, want %s", got, digest)
			}
		}

		// A cache directory others may write to is not trusted.
		open := filepath.Join(t.TempDir(), "open-cache")
		os.Mkdir(open, 0o777)
		os.Chmod(open, 0o777)
		// Shown to the sandbox, a cache the owner names is shared by the
		// calls (otherwise each call caches for itself).
		_, wk2, _ := nodeWorker(t, python, "", []string{"FLUKSIO_ARTIFACT_CACHE=" + open}, "--sandbox-bind", open+":rw")
		answer, _ = runNode(t, wk2, nodeRun("read-open", code, "read", map[string]any{"digest": digest}))
		nodeError(t, answer, "RuntimeError", open, "written by others")
		if os.Geteuid() == 0 {
			theirs := filepath.Join(t.TempDir(), "theirs")
			os.Mkdir(theirs, 0o700)
			os.Chown(theirs, 65534, 65534)
			_, wk3, _ := nodeWorker(t, python, "", []string{"FLUKSIO_ARTIFACT_CACHE=" + theirs}, "--sandbox-bind", theirs+":rw")
			answer, _ = runNode(t, wk3, nodeRun("read-theirs", code, "read", map[string]any{"digest": digest}))
			nodeError(t, answer, "RuntimeError", theirs, "belongs to uid 65534")
		}
	})
}

// TestSandboxedCallsFetchAnArtifactOnce: a sandboxed call caches what it
// fetches for itself; the worker takes what has its digest into its own
// cache once the call is gone, and the calls after it load it from there,
// read-only: a pipeline's model is fetched once, not by every call, no
// call can change it for the next, and none can list what others loaded.
func TestSandboxedCallsFetchAnArtifactOnce(t *testing.T) {
	t.Parallel()
	code := `
import hashlib, os
from fluksio import load_artifact

def read(digest):
    path = load_artifact(digest)
    with open(path, "rb") as f:
        sha = "sha256:" + hashlib.sha256(f.read()).hexdigest()
    try:
        with open(path, "r+b") as f:
            f.write(b"planted")
        wrote = "written"
    except OSError as exc:
        wrote = type(exc).__name__
    try:
        os.chmod(path, 0o644)
        chmod = "changed"
    except OSError as exc:
        chmod = type(exc).__name__
    try:
        listed = len(os.listdir(os.path.dirname(path)))
    except OSError as exc:
        listed = type(exc).__name__
    return {"sha": sha, "path": path, "wrote": wrote, "chmod": chmod, "listed": listed}
`
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "in-the-state-directory", true: "named"}[named], func(t *testing.T) {
			var env []string
			if named {
				env = []string{"FLUKSIO_ARTIFACT_CACHE=" + filepath.Join(t.TempDir(), "cache")}
			}
			eng, wk, _ := nodeWorker(t, runtimePython(t), "", env, "--sandbox", "on")
			digest := eng.PutArtifact(bytes.Repeat([]byte("weights "), 1<<16))
			answer, _ := runNode(t, wk, nodeRun("fetch", code, "read", map[string]any{"digest": digest}))
			first := outputsOf(t, answer)
			if first["sha"] != digest {
				t.Fatalf("the first load: %v", first)
			}
			// The worker's cache, as the calls after it are shown it (the
			// first's own was <state>/calls/<call>/.fluksio-artifacts/sha256).
			state := first["path"].(string)
			for range 5 {
				state = filepath.Dir(state)
			}
			shown := filepath.Join(state, "artifacts", "shown", strings.TrimPrefix(digest, "sha256:"))
			if named {
				shown = filepath.Join(strings.TrimPrefix(env[0], "FLUKSIO_ARTIFACT_CACHE="), "shown", strings.TrimPrefix(digest, "sha256:"))
			}
			eventually(t, time.Minute, "the worker taking the artifact into its cache", func() bool {
				_, err := os.Stat(shown + ".ok")
				return err == nil
			})
			for i := range 2 {
				answer, _ := runNode(t, wk, nodeRun(fmt.Sprintf("load-%d", i), code, "read", map[string]any{"digest": digest}))
				out := outputsOf(t, answer)
				if out["sha"] != digest || out["path"] != shown {
					t.Errorf("load %d: %v, want %s from %s", i, out, digest, shown)
				}
				if out["wrote"] == "written" || out["chmod"] == "changed" {
					t.Errorf("load %d: a call changed the worker's copy: %v", i, out)
				}
				// What other calls loaded is not for it to learn.
				if out["listed"] != "PermissionError" {
					t.Errorf("load %d: a call listed the worker's cache: %v", i, out["listed"])
				}
			}
			if n := eng.ArtifactGets(digest); n != 1 {
				t.Errorf("the artifact was fetched %d times, want once", n)
			}
			if b, err := os.ReadFile(shown); err != nil || !bytes.Equal(b, bytes.Repeat([]byte("weights "), 1<<16)) {
				t.Errorf("the worker's copy changed (%v)", err)
			}
			// A copy touched since it was verified (its stamp no longer
			// holds) is not handed out: the call fetches its own.
			old := time.Now().Add(-time.Hour)
			os.Chtimes(shown, old, old)
			answer, _ = runNode(t, wk, nodeRun("touched", code, "read", map[string]any{"digest": digest}))
			if out := outputsOf(t, answer); out["sha"] != digest || out["path"] == shown {
				t.Errorf("a load after the copy was touched: %v", out)
			}
			if n := eng.ArtifactGets(digest); n != 2 {
				t.Errorf("the artifact was fetched %d times, want twice", n)
			}
		})
	}
}

// Item 4: spawn and forkserver pools work in shipped-source and module
// nodes, and a child Python can import the shipped source by name.
func TestRuntimeNodesSpawnAndForkserverPools(t *testing.T) {
	t.Parallel()
	code := `
import multiprocessing as mp, subprocess, sys
from fluksio import Port, node

def square(x):
    return x * x

@node(provides=[Port("squares", "json"), Port("child", "str")])
def pool(method):
    with mp.get_context(method).Pool(2) as p:
        squares = p.map_async(square, range(6)).get(timeout=20)
    child = ""
    if __name__ != "fluksio_node" and not __name__.startswith("spawnnode"):
        child = subprocess.run([sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec(%r).origin)" % __name__],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    return {"squares": squares, "child": child}
`
	forEachPython(t, func(t *testing.T, python string) {
		modDir := t.TempDir()
		if err := os.WriteFile(filepath.Join(modDir, "spawnnode.py"), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
		// The module's directory is under /tmp, which is the call's own in
		// its sandbox: the owner shows it, as for any dataset or code.
		_, wk, _ := nodeWorker(t, python, "", nil, "--sandbox-bind", modDir)
		want := []any{0.0, 1.0, 4.0, 9.0, 16.0, 25.0}
		for _, method := range []string{"spawn", "forkserver"} {
			answer, _ := runNode(t, wk, nodeRun("src-"+method, code, "pool", map[string]any{"method": method}))
			out := outputsOf(t, answer)
			if fmt.Sprint(out["squares"]) != fmt.Sprint(want) {
				t.Errorf("a %s pool in a source node: %v", method, out)
			}
			if child, _ := out["child"].(string); !strings.HasSuffix(child, "/pipeline.py") {
				t.Errorf("a child Python could not import the shipped source: %q", out["child"])
			}
			req := map[string]any{
				"op": "run", "call_id": "mod-" + method,
				"node":     map[string]any{"module": "spawnnode"},
				"function": "pool", "inputs": map[string]any{"method": method}, "settings": map[string]any{},
				"env": map[string]any{"PYTHONPATH": modDir},
			}
			answer, _ = runNode(t, wk, req)
			if out := outputsOf(t, answer); fmt.Sprint(out["squares"]) != fmt.Sprint(want) {
				t.Errorf("a %s pool in a module node: %v", method, out)
			}
		}
	})
}

// Item 5: lines stay whole with PYTHONUNBUFFERED=1 in the request's env.
func TestRuntimeNodesWholeLinesUnbuffered(t *testing.T) {
	t.Parallel()
	code := `
import threading

def printers(n, lines):
    start = threading.Barrier(n)
    def run(k):
        start.wait()
        for i in range(lines):
            print("printer-%d line %d" % (k, i))
    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {}
`
	whole := regexp.MustCompile(`^printer-\d line \d+$`)
	forEachPython(t, func(t *testing.T, python string) {
		_, wk, _ := nodeWorker(t, python, "", nil)
		for round := 0; round < 3; round++ {
			req := nodeRun(fmt.Sprintf("print-%d", round), code, "printers", map[string]any{"n": 4, "lines": 240})
			req["env"] = map[string]any{"PYTHONUNBUFFERED": "1"}
			answer, events := runNode(t, wk, req)
			outputsOf(t, answer)
			lines := logLines(decodeEvents(t, events))
			var broken []string
			for _, l := range lines {
				if !whole.MatchString(l) {
					broken = append(broken, l)
				}
			}
			if len(broken) > 0 || len(lines) != 4*240 {
				t.Fatalf("round %d: %d lines, %d not whole, e.g. %q", round, len(lines), len(broken), broken[:min(3, len(broken))])
			}
		}
	})
}

// Item 6: a directory saved as an artifact loads back as a directory.
func TestRuntimeNodesDirectoryArtifacts(t *testing.T) {
	t.Parallel()
	code := `
import os, time
from fluksio import load_artifact, save_artifact

def save(root):
    model = os.path.join(root, "hf-model")
    os.makedirs(os.path.join(model, "tokenizer"))
    with open(os.path.join(model, "config.json"), "w") as f:
        f.write('{"layers": 2}')
    with open(os.path.join(model, "tokenizer", "vocab.txt"), "w") as f:
        f.write("a\nb\n")
    os.makedirs(os.path.join(root, "blobs"))
    with open(os.path.join(root, "blobs", "w1"), "wb") as f:
        f.write(b"\x00weights\xff" * 1000)
    os.symlink(os.path.join("..", "blobs", "w1"), os.path.join(model, "model.bin"))  # as a Hugging Face snapshot
    first = save_artifact(model)
    os.utime(os.path.join(model, "config.json"), (1, 1))
    again = save_artifact(model)
    return {"ref": first, "same": first["digest"] == again["digest"]}

def load(ref):
    path = load_artifact(ref)
    found = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, path)] = len(f.read())
    return {"isdir": os.path.isdir(path), "files": found, "again": load_artifact(ref["digest"]) == path}
`
	forEachPython(t, func(t *testing.T, python string) {
		eng, wk, _ := nodeWorker(t, python, "", nil)
		answer, _ := runNode(t, wk, nodeRun("save-dir", code, "save", map[string]any{"root": t.TempDir()}))
		out := outputsOf(t, answer)
		ref, _ := out["ref"].(map[string]any)
		if out["same"] != true || ref["directory"] != true || ref["media_type"] != "application/x-tar" || ref["name"] != "hf-model" {
			t.Fatalf("saving a directory: %v", out)
		}
		stored, ok := eng.Artifact(ref["digest"].(string))
		if !ok {
			t.Fatalf("the engine has no %v", ref["digest"])
		}
		var names []string
		marked := false
		tr := tar.NewReader(bytes.NewReader(stored))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("the stored directory is not a tar archive: %v", err)
			}
			if h.Typeflag == tar.TypeXGlobalHeader {
				marked = h.PAXRecords["FLUKSIO.directory"] == "1"
				continue
			}
			names = append(names, h.Name)
		}
		if !marked {
			t.Errorf("the archive does not carry the FLUKSIO.directory marker")
		}
		if got := strings.Join(names, " "); got != "tokenizer/ config.json model.bin tokenizer/vocab.txt" && got != "tokenizer config.json model.bin tokenizer/vocab.txt" {
			t.Errorf("archive entries: %s", got)
		}

		answer, _ = runNode(t, wk, nodeRun("load-dir", code, "load", map[string]any{"ref": ref}))
		out = outputsOf(t, answer)
		files := fmt.Sprint(out["files"])
		if out["isdir"] != true || out["again"] != true || files != "map[config.json:13 model.bin:9000 tokenizer/vocab.txt:4]" {
			t.Errorf("loading a directory: %v", out)
		}
	})
}

// Item 7: a call's working directory. A worker run from a project
// directory keeps it; one whose directory is not writable (a service in /)
// gives each call a private scratch directory, removed afterwards.
func TestRuntimeNodesWorkingDirectory(t *testing.T) {
	t.Parallel()
	code := `
import os, stat

def train():
    os.makedirs("runs/exp1", exist_ok=True)
    with open("runs/exp1/metrics.txt", "w") as f:
        f.write("loss 0.1\n")
    with open("checkpoint.pt", "wb") as f:
        f.write(b"weights")
    cwd = os.getcwd()
    return {"cwd": cwd, "mode": stat.S_IMODE(os.stat(cwd).st_mode)}
`
	forEachPython(t, func(t *testing.T, python string) {
		project := t.TempDir()
		_, wk, _ := nodeWorker(t, python, project, nil)
		answer, _ := runNode(t, wk, nodeRun("in-project", code, "train", nil))
		if out := outputsOf(t, answer); out["cwd"] != project {
			t.Errorf("run from %s, the node's working directory was %v", project, out["cwd"])
		}
		if _, err := os.Stat(filepath.Join(project, "runs", "exp1", "metrics.txt")); err != nil {
			t.Errorf("the node's relative writes did not land in the project directory: %v", err)
		}

		// /proc takes no new files, not even from root: the service's /.
		_, wk, _ = nodeWorker(t, python, "/proc", nil)
		answer, _ = runNode(t, wk, nodeRun("as-service", code, "train", nil))
		out := outputsOf(t, answer)
		cwd, _ := out["cwd"].(string)
		if filepath.Base(filepath.Dir(cwd)) != "calls" || out["mode"] != float64(0o700) {
			t.Fatalf("the node's working directory was %v (mode %o), want a private <state-dir>/calls/... one", cwd, int(out["mode"].(float64)))
		}
		// Scratch: gone after the call (the directory itself may be kept,
		// emptied, for a later call).
		eventually(t, 10*time.Second, "what the node wrote in the call's directory to be removed", func() bool {
			_, file := os.Stat(filepath.Join(cwd, "checkpoint.pt"))
			_, dir := os.Stat(filepath.Join(cwd, "runs"))
			return os.IsNotExist(file) && os.IsNotExist(dir)
		})
	})
}

func sha256Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
