package installer

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/status"
)

func TestStatusShowsTheListenAddress(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	st := status.Status{PID: 4711, State: "attached", Name: "gpu-box", Engine: "wss://e.example.com/api/v1/workers/attach"}
	var out bytes.Buffer
	writeStatus(&out, l, Running, st, nil)
	if strings.Contains(out.String(), "/metrics") {
		t.Errorf("status shows a monitoring endpoint the worker does not serve:\n%s", out.String())
	}

	st.Listen = "127.0.0.1:9465"
	out.Reset()
	writeStatus(&out, l, Running, st, nil)
	if !strings.Contains(out.String(), "monitor:  http://127.0.0.1:9465/metrics, /healthz and /livez") {
		t.Errorf("status does not show where /metrics is served:\n%s", out.String())
	}
}
