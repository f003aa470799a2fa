package installer

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/status"
)

// What an operator woken at 3 a.m. reads: calls declined and why beside
// those done, the limits in force, and for a worker that stopped, why and
// with which exit code, without a monitor address nothing serves.
func TestStatusTellsTheOperatorWhatHappened(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	st := status.Status{
		PID: 4711, Version: "1.2.3", State: status.StateAttached, Name: "gpu-box",
		Engine: "wss://e.example.com/api/v1/workers/attach", Since: time.Now().Add(-time.Minute),
		CallsDone: 1, CallsDeclined: map[string]int64{"policy": 5, "disk": 2},
		Listen: "127.0.0.1:9465", Updated: time.Now(),
		Limits: "memory 8GiB, 512 processes per call; new calls declined below 1GiB free disk",
	}
	var out bytes.Buffer
	writeStatus(&out, l, Running, st, nil)
	for _, want := range []string{
		"calls:    0 running, 1 done, 7 declined (policy 5, disk 2)",
		"limits:   memory 8GiB, 512 processes per call; new calls declined below 1GiB free disk",
		"monitor:  http://127.0.0.1:9465/metrics",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}

	st.State = status.StateStopped
	st.Exit = &status.Exit{Code: 1, Reason: "refused by the engine", At: time.Now().Add(-3 * time.Minute)}
	out.Reset()
	writeStatus(&out, l, Stopped, st, nil)
	text := out.String()
	if !strings.Contains(text, "worker:   stopped 3m0s ago: refused by the engine (exit code 1)") {
		t.Errorf("a stopped worker's status does not say why and with which exit code:\n%s", text)
	}
	if strings.Contains(text, "monitor:") || strings.Contains(text, "9465") {
		t.Errorf("a stopped worker's status lists a monitor address nothing serves:\n%s", text)
	}
}
