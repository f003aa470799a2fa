package agent_test

// What the engine and the worker say to each other, in this process with
// this test binary as the runner: the hello, events and answers as the
// runner wrote them, heartbeats, bounds, and what the worker makes of
// garbage from either side.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

func TestHelloDescribesTheWorker(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--name", "box-7", "--labels", "gpu, cuda12,,", "--parallel", "3")
	h := f.wk.Hello
	self, _ := os.Executable()
	if h.Op != "hello" || h.Protocol != protocol.Version || h.Name != "box-7" || h.MaxParallel != 3 {
		t.Errorf("hello = %s", h.Raw)
	}
	if strings.Join(h.Labels, "|") != "gpu|cuda12" {
		t.Errorf("labels = %q, want gpu and cuda12 (split on commas, blanks dropped)", h.Labels)
	}
	if h.Python != self {
		t.Errorf("python = %q, want --python as given %q", h.Python, self)
	}
	// The digest of `python -m pip freeze`, which the fake runner answers
	// with one line.
	sum := sha256.Sum256([]byte("fakerunner==1.0\n"))
	if h.VenvDigest != hex.EncodeToString(sum[:])[:16] {
		t.Errorf("venv_digest = %q", h.VenvDigest)
	}
	if h.Inventory.CPUs != runtime.NumCPU() && h.Inventory.CPUs < 1 {
		t.Errorf("cpus = %d", h.Inventory.CPUs)
	}
	if h.Inventory.RAMMB == nil || *h.Inventory.RAMMB < 64 {
		t.Errorf("ram_mb = %v", h.Inventory.RAMMB)
	}
}

// Without --name the worker attaches as the host name.
func TestDefaultNameIsTheHostName(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Skipf("no host name here: %v", err)
	}
	if got := serveFake(t, enginetest.Options{}).wk.Hello.Name; got != host {
		t.Errorf("name %q, want the host name %q", got, host)
	}
}

func TestInventoryFromSLURMAndFlags(t *testing.T) {
	for _, kv := range []string{"SLURM_CPUS_ON_NODE=6", "SLURM_MEM_PER_NODE=12000", "SLURM_JOB_GPUS=2,5,7"} {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
	h := serveFake(t, enginetest.Options{}).wk.Hello
	if h.Inventory.CPUs != 6 || h.Inventory.GPUs != 3 || h.Inventory.RAMMB == nil || *h.Inventory.RAMMB != 12000 {
		t.Errorf("SLURM inventory = %s", h.Raw)
	}
	// SLURM_GPUS_ON_NODE wins over SLURM_JOB_GPUS; flags win over all, and
	// --gpus 0 means zero, not "detect".
	t.Setenv("SLURM_GPUS_ON_NODE", "1")
	h = serveFake(t, enginetest.Options{}, "--cpus", "2", "--ram-mb", "512").wk.Hello
	if h.Inventory.CPUs != 2 || h.Inventory.GPUs != 1 || *h.Inventory.RAMMB != 512 {
		t.Errorf("flag inventory = %s", h.Raw)
	}
	if h = serveFake(t, enginetest.Options{}, "--gpus", "0").wk.Hello; h.Inventory.GPUs != 0 {
		t.Errorf("--gpus 0 gave %s", h.Raw)
	}
}

func TestCallEventsArriveInOrderAndUnchanged(t *testing.T) {
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}).wk
	handWritten := `{"call_id":"c1","event":"log","line":"é \u00e9 <b>&amp;</b>","nested":{"z":1,"a":[1.50,2e3]}}`
	c := run(t, wk, "c1", step{"events": 500}, step{"raw": handWritten}, step{"raw": "  " + handWritten + "  "})
	answer, events := wait(t, c)
	if !answer.OK {
		t.Fatalf("answer = %s", answer.Raw)
	}
	if len(events) != 502 {
		t.Fatalf("got %d events, want 502", len(events))
	}
	for i := 0; i < 500; i++ {
		want := fmt.Sprintf(`{"call_id":"c1","event":"stream","values":{"i":%d}}`, i)
		if string(events[i].Raw) != want {
			t.Fatalf("event %d = %s, want %s", i, events[i].Raw, want)
		}
	}
	for _, ev := range events[500:] {
		if string(ev.Raw) != handWritten {
			t.Errorf("forwarded %s, want the runner's line unchanged (trimmed): %s", ev.Raw, handWritten)
		}
	}
	// The request reached the runner without its env, everything else intact.
	var out struct {
		Outputs struct {
			Request map[string]any `json:"request"`
		} `json:"outputs"`
	}
	answer.Decode(&out)
	if out.Outputs.Request["op"] != "run" || out.Outputs.Request["call_id"] != "c1" || out.Outputs.Request["steps"] == nil {
		t.Errorf("runner saw %v", out.Outputs.Request)
	}
}

func TestHeartbeatsWhileACallRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the 10 s heartbeat")
	}
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}).wk
	start := time.Now()
	// 13 s: one heartbeat (at 10 s), with seconds of margin either side.
	c := run(t, wk, "slow", step{"sleep_ms": 13000})
	answer, events := wait(t, c)
	if !answer.OK {
		t.Fatalf("answer = %s", answer.Raw)
	}
	if len(events) != 1 || events[0].Event != "heartbeat" || string(events[0].Raw) != `{"call_id":"slow","event":"heartbeat"}` {
		t.Fatalf("after %s got events %q, want one heartbeat", time.Since(start), rawOf(events))
	}
}

func TestLargeAnswerAndLineBound(t *testing.T) {
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}, "--max-line", "64MiB").wk
	answer, _ := wait(t, run(t, wk, "big", step{"answer_bytes": 48 << 20}))
	if !answer.OK || len(answer.Raw) < 48<<20 {
		t.Fatalf("48 MiB answer arrived as %d bytes, ok=%v", len(answer.Raw), answer.OK)
	}
	answer, _ = wait(t, run(t, wk, "huge", step{"answer_bytes": 80 << 20}))
	if answer.OK || answer.Error == nil || answer.Error.Type != "RemoteError" || !strings.Contains(answer.Error.Message, "--max-line") {
		t.Fatalf("an 80 MiB line over a 64 MiB bound answered %.300s", answer.Raw)
	}
	// The worker is still fine.
	if answer, _ = wait(t, run(t, wk, "after")); !answer.OK {
		t.Fatalf("after the bound: %s", answer.Raw)
	}
}

func TestParallelCalls(t *testing.T) {
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}, "--parallel", "8").wk
	start := time.Now()
	var calls []*enginetest.Call
	for i := 0; i < 8; i++ {
		calls = append(calls, run(t, wk, fmt.Sprintf("p%d", i), step{"sleep_ms": 1500}, step{"events": 3}))
	}
	for _, c := range calls {
		answer, events := wait(t, c)
		if !answer.OK || len(events) != 3 || answer.CallID != c.ID {
			t.Errorf("%s: answer %s with %d events", c.ID, answer.Raw, len(events))
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("8 calls of 1.5 s took %s: they did not run at once", took)
	}
}

func TestRuntimeFromTheEngineIsUsedAndCached(t *testing.T) {
	t.Parallel()
	served := []byte("# the engine's own runner\n")
	f := serveFake(t, enginetest.Options{Runtime: served}, "--runtime", "auto")
	state := f.stateDir
	answer, _ := wait(t, run(t, f.wk, "r1"))
	var out struct {
		Outputs struct{ PID int } `json:"outputs"`
	}
	answer.Decode(&out)
	files, _ := filepath.Glob(filepath.Join(state, "runtime", "*.py"))
	if len(files) != 1 {
		t.Fatalf("runtime cache holds %v", files)
	}
	got, _ := os.ReadFile(files[0])
	if !bytes.Equal(got, served) {
		t.Errorf("cached runtime = %q, want the engine's", got)
	}
}

func TestGarbageFromEngineAndRunnerNeverBreaksTheSession(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{})
	wk := f.wk
	for _, frame := range []string{"not json", "[1,2]", `"str"`, "null", `{"op":"dance"}`, `{"op":"run"}`, `{"op":"run","call_id":""}`, `{"op":"cancel","call_id":"nobody"}`, `{"op":5}`} {
		if err := wk.Send(frame); err != nil {
			t.Fatal(err)
		}
	}
	wk.Send([]byte{0xff, 0xfe})
	c := run(t, wk, "g1",
		step{"raw": "plain text"}, step{"raw": "{broken json"}, step{"raw": "[1]"}, step{"raw": ""},
		step{"raw_hex": "fffe"}, step{"raw_hex": hex.EncodeToString([]byte(`{"call_id":"g1","event":"stream","values":{"s":"bad ` + "\xff" + ` utf8"}}`))},
		step{"events": 1})
	answer, events := wait(t, c)
	if !answer.OK {
		t.Fatalf("answer = %s", answer.Raw)
	}
	if len(events) != 2 {
		t.Fatalf("forwarded %d events, want only the 2 JSON ones: %q", len(events), rawOf(events))
	}
	if !strings.Contains(string(events[0].Raw), "bad \uFFFD utf8") {
		t.Errorf("invalid UTF-8 was not replaced: %q", events[0].Raw)
	}
	if !strings.Contains(f.log.String(), "not a JSON object") {
		t.Errorf("garbage was not logged locally")
	}
	select {
	case <-wk.Done():
		t.Fatal("the connection went down")
	default:
	}
}

func TestDuplicateCallIDLeavesTheFirstAlone(t *testing.T) {
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}).wk
	first := run(t, wk, "dup", step{"announce": true}, step{"sleep_ms": 800}, step{"events": 1})
	started(t, first) // the first call is running
	if err := wk.Send(map[string]any{"op": "run", "call_id": "dup", "steps": []step{}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, err := first.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.OK || m.Error == nil || !strings.Contains(m.Error.Message, "already running") {
		t.Fatalf("the duplicate was answered %s", m.Raw)
	}
	answer, events := wait(t, first)
	if !answer.OK || len(events) != 1 {
		t.Fatalf("the first call ended %s after %d events", answer.Raw, len(events))
	}
}

func TestEngineRequestJSONPassesThrough(t *testing.T) {
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}).wk
	src := "def f(*, x):\n    return '<&>' + x\n"
	c, _ := wk.Run(map[string]any{"call_id": "j1", "node": map[string]any{"source": src, "filename": "p.py"}, "inputs": map[string]any{"x": "é"}})
	answer, _ := wait(t, c)
	var out struct {
		Outputs struct {
			Request struct {
				Node   map[string]string `json:"node"`
				Inputs map[string]string `json:"inputs"`
			} `json:"request"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(answer.Raw, &out); err != nil {
		t.Fatal(err)
	}
	if out.Outputs.Request.Node["source"] != src || out.Outputs.Request.Inputs["x"] != "é" {
		t.Errorf("runner saw %+v", out.Outputs.Request)
	}
}

// A runner that writes fast and exits while the engine is slow to read:
// everything it wrote, answer included, still arrives, however long the
// output waited in the pipe after the runner was gone. The worker's own
// heartbeats (one every 10 s of a call, which a loaded machine reaches)
// are not the runner's events.
func TestSlowEngineLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses the engine for 3 s four times")
	}
	t.Parallel()
	wk := serveFake(t, enginetest.Options{}).wk
	for _, n := range []int{20000, 40000, 60000, 80000} {
		id := fmt.Sprintf("slow-%d", n)
		wk.PauseReads(3 * time.Second)
		c := run(t, wk, id, step{"pipe_size": 1 << 20}, step{"events": n})
		answer, events := wait(t, c)
		if !answer.OK {
			t.Errorf("%s: answer %.200s", id, answer.Raw)
		}
		if got := streamIndexes(t, events); len(got) != n || !slices.Equal(got, indexes(n)) {
			t.Errorf("%s: got %d of %d stream events (want i = 0 .. %d, each once, in order)", id, len(got), n, n-1)
		}
	}
}

// streamIndexes is the "i" of each stream event, heartbeats left out; any
// other event fails the test.
func streamIndexes(t *testing.T, events []enginetest.Message) []int {
	t.Helper()
	var got []int
	for _, m := range events {
		switch m.Event {
		case "heartbeat":
		case "stream":
			var ev struct{ Values struct{ I int } }
			if err := m.Decode(&ev); err != nil {
				t.Fatalf("stream event %s: %v", m.Raw, err)
			}
			got = append(got, ev.Values.I)
		default:
			t.Fatalf("unexpected event %.200s", m.Raw)
		}
	}
	return got
}

// indexes is 0 .. n-1.
func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

type step = map[string]any

// run sends a fake-runner request with these steps and returns its call.
func run(t *testing.T, wk *enginetest.Worker, id string, steps ...map[string]any) *enginetest.Call {
	t.Helper()
	c, err := wk.Run(map[string]any{"call_id": id, "steps": steps})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wait waits for a call's answer and returns it with the events before it.
func wait(t *testing.T, c *enginetest.Call) (enginetest.Message, []enginetest.Message) {
	t.Helper()
	answer, events, err := c.WaitTimeout(callTimeout)
	if err != nil {
		t.Fatalf("call %s: %v", c.ID, err)
	}
	return answer, events
}
