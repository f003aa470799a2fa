package test

// Helpers shared by the tests that run the worker as a service under a real
// systemd (service_test.go, packaging_systemd_test.go).

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// liveWorker returns the next worker that stays attached: `install` checks
// the engine with a short connection of its own first, which the engine sees
// as a worker that leaves at once.
func liveWorker(ctx context.Context, t *testing.T, eng *enginetest.Engine) *enginetest.Worker {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		w, err := eng.NextWorker(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.Done():
			continue
		case <-time.After(time.Second):
			return w
		}
	}
}

// runDouble runs a real node through the embedded runtime: y = 2x.
func runDouble(ctx context.Context, t *testing.T, w *enginetest.Worker, id string, x int) {
	t.Helper()
	call, err := w.Run(map[string]any{
		"op": "run", "call_id": id,
		"node":     map[string]any{"source": "def f(*, x):\n    return {\"y\": x * 2}\n", "filename": "f.py"},
		"function": "f", "inputs": map[string]any{"x": x}, "settings": map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	answer, _, err := call.Wait(ctx)
	if err != nil {
		t.Fatalf("call %s: %v", id, err)
	}
	var got struct {
		OK      bool `json:"ok"`
		Outputs struct {
			Y *int `json:"y"`
		} `json:"outputs"`
	}
	if err := answer.Decode(&got); err != nil || !got.OK || got.Outputs.Y == nil || *got.Outputs.Y != 2*x {
		t.Errorf("call %s answered %s; want ok with outputs {\"y\": %d}", id, answer.Raw, 2*x)
	}
}

// gpuGroups own the GPU device nodes (/dev/nvidia*, /dev/dri/*) on Debian,
// Ubuntu and RHEL.
var gpuGroups = []string{"video", "render"}

// addGPUGroups creates the GPU groups the test image lacks (a minimal
// Debian has video but not render, which the GPU drivers' udev rules
// bring), so that what install does with them can be checked.
func addGPUGroups(ctx context.Context, t *testing.T, m *nspawn.Machine) {
	t.Helper()
	for _, g := range gpuGroups {
		if out, err := m.Exec(ctx, "getent group "+g+" || groupadd --system "+g); err != nil {
			t.Fatalf("creating group %s: %v\n%s", g, err, out)
		}
	}
}

// checkGPUGroups checks that account is in the groups that own GPU device
// nodes. The test machine must have them (addGPUGroups): a check of a
// group that does not exist would prove nothing.
func checkGPUGroups(ctx context.Context, t *testing.T, m *nspawn.Machine, account string) {
	t.Helper()
	out, err := m.Exec(ctx, "id -nG "+account)
	if err != nil {
		t.Fatalf("id -nG %s: %v\n%s", account, err, out)
	}
	groups := strings.Fields(out)
	for _, g := range gpuGroups {
		if out, err := m.Exec(ctx, "getent group "+g); err != nil {
			t.Errorf("the test machine has no group %s (%v, %s): the check would prove nothing", g, err, out)
		} else if !slices.Contains(groups, g) {
			t.Errorf("%s is not in %s (it is in %v); GPUs would be out of reach", account, g, groups)
		}
	}
}

func mainPID(t *testing.T, sh func(string) string) string {
	t.Helper()
	pid := strings.TrimSpace(sh("systemctl show --property MainPID --value fluksio-worker"))
	if pid == "" || pid == "0" {
		t.Fatalf("the service has no main process (MainPID %q)", pid)
	}
	return pid
}

// stepTimer logs how long each step took since the previous one.
func stepTimer(t *testing.T) func(name string) {
	last := time.Now()
	return func(name string) {
		t.Helper()
		t.Logf("%-45s %v", name, time.Since(last).Round(time.Millisecond))
		last = time.Now()
	}
}

// machineShell runs scripts in m and returns their output, failing the test
// when one fails.
func machineShell(ctx context.Context, t *testing.T, m *nspawn.Machine) func(script string) string {
	return func(script string) string {
		t.Helper()
		out, err := m.Exec(ctx, script)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// longNodeSource is a node like a training run: it yields a value every
// second for `seconds` seconds, then returns.
const longNodeSource = `import time
from fluksio import Port, node

@node(requires=[Port("seconds", "int")], provides=[Port("tick", "int", stream=True), Port("done", "int")])
def long(*, seconds):
    for i in range(seconds):
        yield {"tick": i}
        time.sleep(1)
    return {"done": seconds}
`

// startLongNode starts the long node on w and returns once it has yielded
// its first value, so the call is surely running.
func startLongNode(ctx context.Context, t *testing.T, w *enginetest.Worker, id string, seconds int) *enginetest.Call {
	t.Helper()
	call, err := w.Run(map[string]any{
		"op": "run", "call_id": id,
		"node":     map[string]any{"source": longNodeSource, "filename": "long.py"},
		"function": "long", "inputs": map[string]any{"seconds": seconds}, "settings": map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	first, err := call.Next(ctx)
	if err != nil || !first.IsAnswer() && first.Event != "stream" {
		t.Fatalf("call %s: first frame %s, %v", id, first.Raw, err)
	}
	if first.IsAnswer() {
		t.Fatalf("call %s answered at once: %s", id, first.Raw)
	}
	return call
}

// finishLongNode waits for the long node's answer, which must be ok, and
// for every value it yields.
func finishLongNode(ctx context.Context, t *testing.T, call *enginetest.Call, seconds int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Duration(seconds)*time.Second+60*time.Second)
	defer cancel()
	answer, events, err := call.Wait(ctx)
	if err != nil {
		t.Fatalf("call %s: %v", call.ID, err)
	}
	streamed := 1 // the one startLongNode read
	for _, e := range events {
		if e.Event == "stream" {
			streamed++
		}
	}
	var got struct {
		OK bool `json:"ok"`
	}
	if err := answer.Decode(&got); err != nil || !got.OK || streamed != seconds {
		t.Errorf("call %s answered %s after %d values; want ok after %d", call.ID, answer.Raw, streamed, seconds)
	}
}

// bootMachine boots a fresh systemd machine for the test, closed at its end;
// if the test failed, the service's status and its last journal lines are
// logged first.
func bootMachine(ctx context.Context, t *testing.T) *nspawn.Machine {
	t.Helper()
	m, err := nspawn.Boot(ctx, nspawn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := m.Exec(context.Background(), "systemctl status --no-pager fluksio-worker; journalctl --no-pager -n 100 -u fluksio-worker")
			t.Logf("the service at the end:\n%s", out)
		}
		m.Close()
	})
	return m
}
