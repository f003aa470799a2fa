package test

// Node code as ML engineers write it, third round, through the real binary
// and the embedded runtime on every Python 3.8+ found: the node's own
// module in child interpreters, exit handlers after the answer, lines
// written just before a hard exit, output floods, a patched standard
// library, a node's own SIGTERM handler, numpy bools, progress bars, and
// preloading a module that imports the SDK. Debian's python3 also runs
// them with numpy, scikit-learn, joblib and tqdm.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lastWordsNode prints, then dies without unwinding: os._exit, or a
// segfault whose faulthandler stack must reach the engine too.
const lastWordsNode = `import ctypes, os, sys

def hard_exit():
    print("working", flush=True)
    print("last words", flush=True)
    os._exit(3)

def segfault():
    print("last words", flush=True)
    ctypes.string_at(0)
`

const floodNode = `def train():
    for i in range(5000):
        print("step", i)
    print("FINAL accuracy=0.93")
    return {}
`

const patchedNode = `import builtins, functools, io, json, os, sys
from fluksio import Port, node

@node(provides=[Port("loss", "float", stream=True), Port("done", "json")])
def patched():
    json.dumps = functools.partial(json.dumps, indent=2)
    real_write = os.write
    os.write = lambda fd, data: real_write(fd, b"PATCHED " + bytes(data))
    real_print = builtins.print
    builtins.print = lambda *a, **k: real_print("patched print:", *a, **k)
    print("hello")
    sys.stdout = io.StringIO()
    yield {"loss": 0.5}
    return {"done": {"nested": [1, 2]}}
`

const sigtermNode = `import signal, time

def stubborn():
    signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
    print("ready", flush=True)
    for i in range(300000):
        print("busy", i)
    time.sleep(0.5)
    return {"finished": True}
`

const valuesNode = `import subprocess, sys
from fluksio import Port, node

class bool_:  # numpy.bool_ as the runtime sees it: by type, never importing numpy
    def __init__(self, v):
        self.v = v
    def __bool__(self):
        return self.v

bool_.__module__ = "numpy"

@node(provides=[Port("good", "bool"), Port("imported", "str")])
def values():
    sys.stderr.write("\r 50%|#####     |")
    sys.stderr.write("\r" + " " * 80 + "\r")
    print("over the bar")
    child = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.values.__name__)"], stdout=subprocess.PIPE, check=True)
    return {"good": bool_(True), "imported": child.stdout.decode().strip()}
`

func TestRuntimeRealCode(t *testing.T) {
	t.Parallel()
	forEachPython(t, func(t *testing.T, python string) {
		// Where nodes write what this test reads, shown to their sandbox
		// (the test's /tmp is not theirs).
		shown := t.TempDir()
		_, wk, _ := nodeWorker(t, python, "", nil, "--cancel-grace", "2s", "--sandbox-bind", shown+":rw")
		t.Run("hard-exit", func(t *testing.T) {
			// Lost in one to two calls of three before the worker read
			// what the runner left in the node's pipes.
			for i := 0; i < 8; i++ {
				for _, fn := range []string{"hard_exit", "segfault"} {
					answer, events := runNode(t, wk, nodeRun(fmt.Sprintf("%s-%d", fn, i), lastWordsNode, fn, nil))
					if e, _ := answer["error"].(map[string]any); e["type"] != "RemoteError" {
						t.Fatalf("%s: answer %v, want the worker's RemoteError", fn, answer)
					}
					lines := strings.Join(logLines(decodeEvents(t, events)), "\n")
					if !strings.Contains(lines, "last words") {
						t.Fatalf("%s, call %d: the last line printed is missing from the call's logs:\n%s", fn, i, lines)
					}
					if fn == "segfault" && !(strings.Contains(lines, "Fatal Python error") && strings.Contains(lines, "in segfault")) {
						t.Fatalf("call %d: the segfault's Python stack is missing from the call's logs:\n%s", i, lines)
					}
				}
			}
		})
		t.Run("exit-semantics", func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(moduleRoot(t), "agent", "runtime", "examples", "tracker.py"))
			if err != nil {
				t.Fatal(err)
			}
			exitNode := string(b)
			out := filepath.Join(shown, "exit")
			if err := os.Mkdir(out, 0o700); err != nil {
				t.Fatal(err)
			}
			answer, _ := runNode(t, wk, nodeRun("exit", exitNode, "train", map[string]any{"out": out}))
			outputsOf(t, answer) // answered while the atexit handler waits for this test
			if err := os.WriteFile(filepath.Join(out, "answer-seen"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]string{"atexit": "ran", "metrics.csv": "epoch,loss\n1,0.5\n", "run.log": "kept in memory until shutdown\n"} {
				eventually(t, 30*time.Second, name+" written at exit", func() bool {
					b, _ := os.ReadFile(filepath.Join(out, name))
					return string(b) == want
				})
			}
			// A thread that never ends holds the call for the grace at most.
			outputsOf(t, func() map[string]any { a, _ := runNode(t, wk, nodeRun("stuck", exitNode, "stuck", nil)); return a }())
			// The next call gets the slot (a node that writes no files: this
			// test's directories are removed when it returns).
			outputsOf(t, func() map[string]any {
				a, _ := runNode(t, wk, nodeRun("after-stuck", "def f():\n    return {}\n", "f", nil))
				return a
			}())
		})
		t.Run("flood", func(t *testing.T) {
			answer, events := runNode(t, wk, nodeRun("flood", floodNode, "train", nil))
			outputsOf(t, answer)
			lines := logLines(decodeEvents(t, events))
			if len(lines) < 100 || lines[0] != "step 0" || lines[len(lines)-1] != "FINAL accuracy=0.93" || lines[len(lines)-100] != "step 4901" {
				t.Fatalf("a flood must keep its first lines and its last 100; got %d lines, from %q to %q", len(lines), lines[0], lines[len(lines)-1])
			}
			if !strings.Contains(strings.Join(lines, "\n"), "lines dropped here") {
				t.Error("no note says where lines were dropped")
			}
		})
		t.Run("patched-stdlib", func(t *testing.T) {
			answer, events := runNode(t, wk, nodeRun("patched", patchedNode, "patched", nil))
			if out := outputsOf(t, answer); fmt.Sprint(out["done"]) != "map[nested:[1 2]]" {
				t.Errorf("outputs %v", out)
			}
			if !strings.Contains(strings.Join(logLines(decodeEvents(t, events)), "\n"), "patched print: hello") {
				t.Error("the patched print's line is missing")
			}
		})
		t.Run("own-sigterm-handler", func(t *testing.T) {
			for i := 0; i < 3; i++ {
				id := fmt.Sprintf("sigterm-%d", i)
				c := startNode(t, wk, nodeRun(id, sigtermNode, "stubborn", nil))
				for {
					m, err := c.Next(timeoutCtx(t, 30*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					if strings.Contains(string(m.Raw), `"ready"`) {
						break
					}
				}
				if err := wk.Cancel(id); err != nil {
					t.Fatal(err)
				}
				answer, _ := wait(t, c)
				var out map[string]any
				answer.Decode(&out)
				nodeError(t, out, "NodeCancelled")
			}
		})
		t.Run("values-and-children", func(t *testing.T) {
			answer, events := runNode(t, wk, nodeRun("values", valuesNode, "values", nil))
			if out := outputsOf(t, answer); out["good"] != true || out["imported"] != "values" {
				t.Errorf("outputs %v", out)
			}
			for _, line := range logLines(decodeEvents(t, events)) {
				if strings.TrimSpace(line) == "" {
					t.Errorf("a blank log line was sent: %q", line)
				}
			}
		})
	})
}

// mlNode uses what ML code uses: joblib's default backend (loky) and
// scikit-learn's n_jobs with a class of the node's own, numpy, tqdm.
const mlNode = `import numpy as np
from fluksio import Port, node
from joblib import Parallel, delayed
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from tqdm import tqdm

def square(x):
    return x * x

class MyScaler(BaseEstimator, TransformerMixin):
    def fit(self, X, y=None):
        self.mean_ = X.mean(axis=0)
        return self
    def transform(self, X):
        return X - self.mean_

@node(provides=[Port("squares", "list"), Port("folds", "int"), Port("good", "bool")])
def train():
    for _ in tqdm(range(3), leave=False):
        pass
    rng = np.random.RandomState(0)
    X = rng.rand(60, 3)
    y = (X[:, 0] > 0.5).astype(int)
    scores = cross_val_score(make_pipeline(MyScaler(), LogisticRegression()), X, y, cv=3, n_jobs=2)
    return {
        "squares": Parallel(n_jobs=2)(delayed(square)(i) for i in range(5)),
        "folds": len(scores),
        "good": scores.mean() > 0.5,
    }
`

func TestRuntimeRealCodeLibraries(t *testing.T) {
	t.Parallel()
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import joblib, numpy, sklearn, tqdm").Run(); err != nil {
		t.Skip("Debian's python3 with joblib, numpy, scikit-learn and tqdm is needed:", err)
	}
	modules := t.TempDir()
	if err := os.WriteFile(filepath.Join(modules, "my_ml_node.py"), []byte(mlNode), 0o600); err != nil {
		t.Fatal(err)
	}
	_, wk, _ := nodeWorker(t, python, "", []string{"PYTHONPATH=" + modules})
	want := "map[folds:3 good:true squares:[0 1 4 9 16]]"
	for _, req := range []map[string]any{
		nodeRun("shipped", mlNode, "train", nil),
		{"op": "run", "call_id": "module", "node": map[string]any{"module": "my_ml_node"}, "function": "train", "inputs": map[string]any{}},
	} {
		answer, events := runNode(t, wk, req)
		if out := outputsOf(t, answer); fmt.Sprint(out) != want {
			t.Errorf("%v: outputs %v, want %s", req["call_id"], out, want)
		}
		for _, line := range logLines(decodeEvents(t, events)) {
			if strings.TrimSpace(line) == "" {
				t.Errorf("%v: a blank log line was sent", req["call_id"])
			}
		}
	}
}

// A spare preloads the user's own module, which imports the SDK first.
func TestWarmPreloadOfAModuleThatImportsTheSDK(t *testing.T) {
	t.Parallel()
	modules := t.TempDir()
	code := "from fluksio import Port, node\n\n@node(provides=[Port('x', 'int')])\ndef seven():\n    return 7\n"
	if err := os.WriteFile(filepath.Join(modules, "my_nodes.py"), []byte(code), 0o600); err != nil {
		t.Fatal(err)
	}
	_, wk, w, _ := warmWorker(t, []string{"PYTHONPATH=" + modules}, "--warm", "1", "--preload", "my_nodes")
	addr := monitorAddr(t, w)
	probe := "import sys\n\ndef f():\n    return {'preloaded': 'my_nodes' in sys.modules}\n"
	runWarm(t, wk, nodeRun("cold", probe, "f", nil)) // teaches the pool the environment
	waitSpares(t, addr, 1)
	out := runWarm(t, wk, nodeRun("pre", probe, "f", nil))
	if out["preloaded"] != true {
		t.Errorf("the spare did not hold the preloaded module: %v", out)
	}
	if strings.Contains(w.logs.String(), "could not be imported") {
		t.Errorf("the preload failed:\n%s", w.logs.String())
	}
}
