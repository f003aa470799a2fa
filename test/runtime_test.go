package test

// The embedded Python runtime end to end: the real binary, attached to the
// fake engine, running real node code on a real Python through
// agent/runtime/worker_main.py. The runtime's own unit tests (Python, in
// agent/runtime/tests) cover it in depth; these prove the whole path.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/platform"
)

// runtimePython is the interpreter these tests run nodes on:
// $FLUKSIO_TEST_PYTHON, else Debian's /usr/bin/python3, else python3 on PATH.
func runtimePython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("FLUKSIO_TEST_PYTHON"), "/usr/bin/python3"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("python3"); err == nil {
		return p
	}
	t.Skip("no Python 3 to run nodes on")
	return ""
}

// pythonWorker starts the binary as a user would: the embedded runtime, a
// token file, a real Python.
func pythonWorker(t *testing.T, extraEnv ...string) (*enginetest.Engine, *enginetest.Worker, *worker) {
	t.Helper()
	eng := startEngine(t, enginetest.Options{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := startBinary(t, append([]string{"FLUKSIO_ARTIFACT_CACHE=" + t.TempDir()}, extraEnv...),
		"run",
		"--url", eng.AttachURL(),
		"--token-file", tokenFile,
		"--python", runtimePython(t),
		"--runtime", "embedded",
		"--state-dir", t.TempDir(),
		"--log-level", "debug",
	)
	return eng, attach(t, eng), w
}

func nodeRun(id, source, function string, inputs map[string]any) map[string]any {
	if inputs == nil {
		inputs = map[string]any{}
	}
	return map[string]any{
		"op": "run", "call_id": id,
		"node":     map[string]any{"source": source, "filename": "pipeline.py"},
		"function": function, "inputs": inputs, "settings": map[string]any{},
	}
}

func startNode(t *testing.T, wk *enginetest.Worker, req map[string]any) *enginetest.Call {
	t.Helper()
	c, err := wk.Run(req)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runNode runs one call to its answer; the answer is decoded into a map.
func runNode(t *testing.T, wk *enginetest.Worker, req map[string]any) (map[string]any, []enginetest.Message) {
	t.Helper()
	answer, events := wait(t, startNode(t, wk, req))
	var out map[string]any
	if err := answer.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out, events
}

type nodeEvent struct {
	Event  string         `json:"event"`
	Values map[string]any `json:"values"`
	Stream string         `json:"stream"`
	Line   string         `json:"line"`
}

func decodeEvents(t *testing.T, events []enginetest.Message) []nodeEvent {
	t.Helper()
	var out []nodeEvent
	for _, m := range events {
		var e nodeEvent
		if err := m.Decode(&e); err != nil {
			t.Fatalf("event %s: %v", m.Raw, err)
		}
		if m.CallID == "" {
			t.Fatalf("event without call_id: %s", m.Raw)
		}
		out = append(out, e)
	}
	return out
}

func logLines(events []nodeEvent) []string {
	var lines []string
	for _, e := range events {
		if e.Event == "log" {
			lines = append(lines, e.Line)
		}
	}
	return lines
}

func outputsOf(t *testing.T, answer map[string]any) map[string]any {
	t.Helper()
	if answer["ok"] != true {
		t.Fatalf("expected ok, got %v", answer)
	}
	out, _ := answer["outputs"].(map[string]any)
	return out
}

// nodeError checks an error answer's shape and returns its error object.
func nodeError(t *testing.T, answer map[string]any, typ string, fragments ...string) map[string]any {
	t.Helper()
	if answer["ok"] != false {
		t.Fatalf("expected an error answer, got %v", answer)
	}
	e, _ := answer["error"].(map[string]any)
	if e["type"] != typ {
		t.Fatalf("error type %v, want %s: %v", e["type"], typ, e)
	}
	msg, _ := e["message"].(string)
	if e["short"] != typ+": "+msg {
		t.Errorf("short = %q, want %q", e["short"], typ+": "+msg)
	}
	for _, f := range fragments {
		if !strings.Contains(msg, f) {
			t.Errorf("message %q does not contain %q", msg, f)
		}
	}
	if tb, _ := e["traceback"].(string); strings.Contains(tb, "worker_main.py") {
		t.Errorf("the traceback shows the runtime's own frames:\n%s", tb)
	}
	return e
}

func exampleTrain(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "agent", "runtime", "examples", "train.py"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRuntimeStreamsInOrderAndLive(t *testing.T) {
	t.Parallel()
	_, wk, _ := pythonWorker(t)
	req := nodeRun("train-1", exampleTrain(t), "train", map[string]any{"steps": 4})
	req["settings"] = map[string]any{"delay": 0.3}
	c := startNode(t, wk, req)

	started := time.Now()
	var firstStream time.Duration
	var events []enginetest.Message
	var answer enginetest.Message
	for {
		m, err := c.Next(timeoutCtx(t, 60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.IsAnswer() {
			answer = m
			break
		}
		if m.Event == "stream" && firstStream == 0 {
			firstStream = time.Since(started)
		}
		events = append(events, m)
	}
	total := time.Since(started)
	if total-firstStream < 600*time.Millisecond {
		t.Errorf("the first stream event came %s into a %s call: not live", firstStream, total)
	}

	var losses, lrs []float64
	var sawLog bool
	for _, e := range decodeEvents(t, events) {
		switch e.Event {
		case "stream":
			if len(e.Values) != 1 {
				t.Errorf("the example yields one port at a time, got %v", e.Values)
			}
			if v, ok := e.Values["loss"].(float64); ok {
				losses = append(losses, v)
			}
			if v, ok := e.Values["lr_now"].(float64); ok {
				lrs = append(lrs, v)
			}
		case "log":
			sawLog = sawLog || strings.HasPrefix(e.Line, "step 1/4")
		}
	}
	if len(losses) != 4 || len(lrs) != 4 {
		t.Fatalf("losses %v, lrs %v: want 4 of each", losses, lrs)
	}
	for i := 1; i < 4; i++ {
		if losses[i] >= losses[i-1] {
			t.Errorf("losses out of order: %v", losses)
		}
	}
	if !sawLog {
		t.Error("the node's print did not arrive as a log event")
	}
	var out struct {
		OK      bool `json:"ok"`
		Outputs struct {
			Model map[string]any `json:"model"`
			Final struct {
				Loss  float64 `json:"loss"`
				Steps int     `json:"steps"`
			} `json:"final"`
		} `json:"outputs"`
	}
	if err := answer.Decode(&out); err != nil || !out.OK {
		t.Fatalf("answer %s (%v)", answer.Raw, err)
	}
	if out.Outputs.Final.Steps != 4 || out.Outputs.Final.Loss != losses[3] {
		t.Errorf("final %+v, last loss %v", out.Outputs.Final, losses[3])
	}
}

func TestRuntimeArtifactsRoundTripThroughTheEngine(t *testing.T) {
	t.Parallel()
	eng, wk, _ := pythonWorker(t)
	train := exampleTrain(t)
	req := nodeRun("train-2", train, "train", map[string]any{"steps": 2})
	req["settings"] = map[string]any{"delay": 0}
	answer, _ := runNode(t, wk, req)
	outputs := outputsOf(t, answer)
	model := outputs["model"].(map[string]any)
	digest, _ := model["digest"].(string)
	stored, ok := eng.Artifact(digest)
	if !ok {
		t.Fatalf("the engine has no artifact %s", digest)
	}
	var saved struct {
		Weight float64 `json:"weight"`
	}
	if err := json.Unmarshal(stored, &saved); err != nil {
		t.Fatalf("stored model %q: %v", stored, err)
	}
	if model["name"] != "model.json" || model["media_type"] != "application/json" || model["size"] != float64(len(stored)) {
		t.Errorf("reference %v", model)
	}

	answer, _ = runNode(t, wk, nodeRun("eval-2", train, "evaluate", map[string]any{"model": model}))
	if got := outputsOf(t, answer)["weight"]; got != saved.Weight {
		t.Errorf("evaluate loaded weight %v, the engine stored %v", got, saved.Weight)
	}

	// An artifact the engine put there itself, loaded by digest string.
	data := bytes.Repeat([]byte("fluksio "), 1000)
	put := eng.PutArtifact(data)
	code := "import hashlib\nfrom fluksio import load_artifact\ndef f(digest):\n    with open(load_artifact(digest), 'rb') as fh:\n        return {'sha': hashlib.sha256(fh.read()).hexdigest()}\n"
	answer, _ = runNode(t, wk, nodeRun("load-2", code, "f", map[string]any{"digest": put}))
	if got := outputsOf(t, answer)["sha"]; "sha256:"+got.(string) != put {
		t.Errorf("loaded %v, want %s", got, put)
	}
}

func TestRuntimeBigArtifact(t *testing.T) {
	t.Parallel()
	const size = 128 << 20
	// A file of the machine's, shown to the sandboxed node as an owner
	// shows a data set.
	data := t.TempDir()
	eng, wk, _ := pythonWorker(t, "FLUKSIO_WORKER_SANDBOX_BIND="+data)
	path := filepath.Join(data, "weights.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse but not all zeros: a marker at each end.
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), size-4)
	f.Close()

	code := `
import os, resource
from fluksio import Port, node, save_artifact, load_artifact

@node(requires=[Port("path", "str")], provides=[Port("ref", "artifact"), Port("back", "int"), Port("peak_mib", "float")])
def big(*, path):
    ref = save_artifact(path)
    back = os.path.getsize(load_artifact(ref))
    return {"ref": ref, "back": back, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
`
	answer, _ := runNode(t, wk, nodeRun("big-1", code, "big", map[string]any{"path": path}))
	out := outputsOf(t, answer)
	ref := out["ref"].(map[string]any)
	stored, ok := eng.Artifact(ref["digest"].(string))
	if !ok || len(stored) != size {
		t.Fatalf("the engine holds %d bytes for %v (want %d)", len(stored), ref, size)
	}
	sum := sha256.Sum256(stored)
	if ref["digest"] != "sha256:"+hex.EncodeToString(sum[:]) || ref["name"] != "weights.bin" {
		t.Errorf("reference %v", ref)
	}
	if out["back"] != float64(size) {
		t.Errorf("loaded back %v bytes", out["back"])
	}
	if peak := out["peak_mib"].(float64); peak > 64 {
		t.Errorf("the runtime peaked at %.0f MiB moving a %d MiB file: not streamed", peak, size>>20)
	}
}

// Lines a generator prints on both pipes keep their place around its
// stream events when the events come faster than the worker reads them
// (many in one read of the runner's stdout, the node's pipes read once for
// them all): each "before i" ahead of the i-th event, each "after i"
// behind it. A line waiting for a later event, read first from one pipe,
// held back the other pipe's lines due now, to the last event.
func TestRuntimePrintsKeepTheirPlaceAroundAFastGenerator(t *testing.T) {
	t.Parallel()
	_, wk, _ := pythonWorker(t)
	code := `
import sys
from fluksio import Port, node

@node(provides=[Port("loss", "float", stream=True), Port("done", "bool")])
def fast():
    for i in range(200):
        print("before", i)
        print("err before", i, file=sys.stderr)
        yield {"loss": float(i)}
        print("after", i)
    return {"done": True}
`
	answer, events := runNode(t, wk, nodeRun("fast", code, "fast", nil))
	if out := outputsOf(t, answer); out["done"] != true {
		t.Fatalf("outputs %v", out)
	}
	streams := 0 // stream events seen so far
	at := map[string]int{}
	for _, e := range decodeEvents(t, events) {
		switch e.Event {
		case "stream":
			if loss, _ := e.Values["loss"].(float64); int(loss) != streams {
				t.Fatalf("stream event %v after %d others", e.Values, streams)
			}
			streams++
		case "log":
			at[e.Line] = streams
		}
	}
	if streams != 200 {
		t.Fatalf("%d stream events, want 200", streams)
	}
	for i := range 200 {
		for _, line := range []string{fmt.Sprint("before ", i), fmt.Sprint("err before ", i)} {
			if n, ok := at[line]; !ok || n != i {
				t.Errorf("%q came after %d stream events (seen: %v), want %d", line, n, ok, i)
			}
		}
		if n, ok := at[fmt.Sprint("after ", i)]; !ok || n < i+1 {
			t.Errorf("%q came after %d stream events (seen: %v), want %d or more", fmt.Sprint("after ", i), n, ok, i+1)
		}
	}
}

func TestRuntimePrintsNeverCorruptTheProtocol(t *testing.T) {
	t.Parallel()
	_, wk, w := pythonWorker(t)
	code := `
import ctypes, os, subprocess, sys
from fluksio import Port, node

@node(provides=[Port("loss", "float", stream=True), Port("done", "bool")])
def noisy():
    print('{"call_id": "noisy", "ok": true, "outputs": {"forged": 1}}')
    print("plain print")
    os.write(1, b"fd one\n")
    os.write(2, b"fd two\n")
    ctypes.CDLL(None).printf(b"c printf %d\n", 7)
    subprocess.run(["sh", "-c", "echo child out; echo child err >&2"])
    for i in range(20000):
        print("flood", i)
    yield {"loss": 0.5}
    return {"done": True}
`
	answer, events := runNode(t, wk, nodeRun("noisy", code, "noisy", nil))
	if out := outputsOf(t, answer); out["done"] != true || len(out) != 1 {
		t.Fatalf("outputs %v: the forged answer must stay a log line", out)
	}
	evs := decodeEvents(t, events)
	lines := strings.Join(logLines(evs), "\n")
	for _, want := range []string{`"forged": 1`, "plain print", "fd one", "fd two", "c printf 7", "child out", "child err", "lines dropped"} {
		if !strings.Contains(lines, want) {
			t.Errorf("no log line with %q", want)
		}
	}
	var streams int
	for _, e := range evs {
		if e.Event == "stream" {
			streams++
		}
	}
	if streams != 1 || len(events) > 5000 {
		t.Errorf("%d stream events, %d events in all: want 1, and bounded logs", streams, len(events))
	}
	eventually(t, 10*time.Second, "the node's output in the worker's log", func() bool {
		return strings.Contains(w.logs.String(), "child err")
	})
	// Frames arrive in the order they were sent: once a later call has
	// answered, any stray frame of this one would already be here.
	if answer, _ := runNode(t, wk, nodeRun("marker", "def f():\n    return {}\n", "f", nil)); answer["ok"] != true {
		t.Fatalf("the call after the noisy one: %v", answer)
	}
	if m, err := wk.Stray(timeoutCtx(t, time.Millisecond)); err == nil {
		t.Errorf("a frame for no call: %s", m.Raw)
	}
}

func TestRuntimeErrorKinds(t *testing.T) {
	t.Parallel()
	_, wk, _ := pythonWorker(t)
	gen := "from fluksio import Port, node\n@node(provides=[Port('loss', 'float', stream=True), Port('final', 'float')])\ndef train():\n"
	cases := []struct {
		name, code, function, typ string
		fragments                 []string
	}{
		{"exception", "def f():\n    raise ValueError('bad input')\n", "f", "ValueError", []string{"bad input"}},
		{"missing module", "import os\nimport no_such_module_x\ndef f():\n    pass\n", "f", "ModuleNotFoundError", []string{"no_such_module_x", "line 2"}},
		{"syntax", "def f(:\n    pass\n", "f", "SyntaxError", []string{"line 1"}},
		{"sys.exit", "import sys\ndef f():\n    sys.exit(4)\n", "f", "SystemExit", []string{"sys.exit(4)"}},
		{"keyboard interrupt", "def f():\n    raise KeyboardInterrupt\n", "f", "KeyboardInterrupt", nil},
		{"missing function", "def f():\n    pass\n", "g", "AttributeError", []string{"'g'"}},
		{"missing input", "def f(*, x):\n    return {}\n", "f", "TypeError", []string{"'x'"}},
		{"nan stream", gen + "    yield {'loss': float('nan')}\n", "train", "ValueError", []string{"'loss'", "nan"}},
		{"undeclared stream", gen + "    yield {'acc': 1.0}\n", "train", "ValueError", []string{"'acc'", "undeclared"}},
		{"bool for float", gen + "    yield {'loss': True}\n", "train", "TypeError", []string{"'loss'", "bool"}},
		{"non-json output", gen + "    yield {'loss': 1.0}\n    return {'final': object()}\n", "train", "TypeError", []string{"'final'"}},
		{"nested inf", "from fluksio import Port, node\n@node(provides=Port('cfg', 'json'))\ndef f():\n    return {'a': [float('inf')]}\n", "f", "ValueError", []string{"'cfg'", "inf"}},
	}
	for i, tc := range cases {
		answer, _ := runNode(t, wk, nodeRun("err-"+string(rune('a'+i)), tc.code, tc.function, nil))
		t.Run(tc.name, func(t *testing.T) {
			nodeError(t, answer, tc.typ, tc.fragments...)
		})
	}
}

func TestRuntimeCompile(t *testing.T) {
	t.Parallel()
	_, wk, _ := pythonWorker(t)
	source := exampleTrain(t)
	answer, _ := runNode(t, wk, map[string]any{
		"op": "compile", "call_id": "compile-good",
		"node": map[string]any{"source": source, "filename": "train.py"},
	})
	var good struct {
		OK     bool   `json:"ok"`
		Digest string `json:"digest"`
		Nodes  []struct {
			Name     string           `json:"name"`
			Requires []map[string]any `json:"requires"`
			Provides []map[string]any `json:"provides"`
			Timeout  float64          `json:"timeout"`
			Device   string           `json:"device"`
		} `json:"nodes"`
	}
	raw, _ := json.Marshal(answer)
	json.Unmarshal(raw, &good)
	sum := sha256.Sum256([]byte(source))
	if !good.OK || good.Digest != "sha256:"+hex.EncodeToString(sum[:]) || len(good.Nodes) != 2 {
		t.Fatalf("compile answer %s", raw)
	}
	train := good.Nodes[0]
	if train.Name != "train" || train.Timeout != 120 || train.Device != "cpu" || len(train.Provides) != 4 ||
		train.Provides[0]["name"] != "loss" || train.Provides[0]["stream"] != true || train.Requires[0]["initial"] != float64(5) {
		t.Errorf("train node %+v", train)
	}

	answer, _ = runNode(t, wk, map[string]any{
		"op": "compile", "call_id": "compile-broken",
		"node": map[string]any{"source": "import json\n\ndef f(\n", "filename": "broken.py"},
	})
	nodeError(t, answer, "SyntaxError", "broken.py", "line 3")
}

func TestRuntimeCancelledGenerator(t *testing.T) {
	t.Parallel()
	// A grace far longer than the bound below: an answer within it can
	// only be the runtime's own, at SIGTERM, not the agent's after SIGKILL.
	_, wk, _ := pythonWorker(t, "FLUKSIO_WORKER_CANCEL_GRACE=60s")
	code := `
import os, time
from fluksio import Port, node

@node(provides=[Port("pid", "int", stream=True), Port("final", "float")])
def train():
    yield {"pid": os.getpid()}
    while True:
        time.sleep(0.1)
`
	c := startNode(t, wk, nodeRun("cancel-1", code, "train", nil))
	var pid int
	for pid == 0 {
		m, err := c.Next(timeoutCtx(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Event == "stream" {
			pid = intField(t, m, "values", "pid")
		}
	}
	sent := time.Now()
	if err := wk.Cancel("cancel-1"); err != nil {
		t.Fatal(err)
	}
	answer, _ := wait(t, c)
	var out map[string]any
	answer.Decode(&out)
	e := nodeError(t, out, "NodeCancelled")
	if took := time.Since(sent); took > 20*time.Second {
		t.Errorf("the cancel took %s: the runtime should answer at SIGTERM, before the agent's SIGKILL", took)
	}
	if tb, _ := e["traceback"].(string); !strings.Contains(tb, "in train") {
		t.Errorf("the traceback does not say where the node was:\n%s", tb)
	}
	eventually(t, 10*time.Second, "the node's process to be gone", func() bool { return !platform.ProcessAlive(pid) })
}
