package test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// After an outsized frame from the engine, and after a call with an
// outsized request and answer, the worker gives the memory back. Its
// resident memory before, at the peak and after is logged.
func TestMemoryIsGivenBackAfterOutsizedMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a few hundred MiB")
	}
	eng := startEngine(t, enginetest.Options{})
	w := startProgram(t, releaseWorkerBin(t), []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
		"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded",
		"--state-dir", t.TempDir())
	wk := attach(t, eng)
	pid := w.cmd.Process.Pid
	wait(t, run(t, wk, "warm"))
	time.Sleep(300 * time.Millisecond)
	idle := procStatus(t, pid, "VmRSS")
	t.Logf("idle: %s", memLine(t, pid))
	// Given back means resident memory near idle again; the bound leaves
	// room for the collector's own bookkeeping, not for the message.
	const slackKB = 48 << 10
	settled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for procStatus(t, pid, "VmRSS") > idle+slackKB {
			if time.Now().After(deadline) {
				t.Fatalf("15 s after %s: %s; idle was %.1f MiB", what, memLine(t, pid), float64(idle)/1024)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("after %s: %s", what, memLine(t, pid))
	}

	frame := make([]byte, 100<<20)
	for i := range frame {
		frame[i] = 'x'
	}
	if err := wk.Send(frame); err != nil {
		t.Fatal(err)
	}
	frame = nil
	wait(t, run(t, wk, "sync"))
	settled("a 100 MiB frame that is not JSON")

	// The fake runner's answer carries the request it got: 100 MB each way.
	pad := strings.Repeat("p", 100_000_000)
	c, err := wk.Run(map[string]any{"call_id": "big", "pad": pad})
	if err != nil {
		t.Fatal(err)
	}
	pad = ""
	answer, _ := wait(t, c)
	var out struct {
		Outputs struct {
			Request json.RawMessage `json:"request"`
		} `json:"outputs"`
	}
	if err := answer.Decode(&out); err != nil || len(out.Outputs.Request) < 100_000_000 {
		t.Fatalf("the big call answered %d bytes: %v", len(answer.Raw), err)
	}
	settled("a call with a 100 MB request and answer")
}
