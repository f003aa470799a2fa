package installer

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/status"
)

// Calls held through an outage (the resume extension) are shown: which,
// since when, what their kept output takes, when they will be stopped.
func TestStatusShowsHeldCalls(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	since := time.Date(2026, 12, 3, 14, 0, 0, 0, time.Local)
	st := status.Status{
		PID: 4711, Version: "1.2.3", State: "connecting", CallsRunning: 2,
		Held: &status.Held{Calls: []string{"c1", "c2"}, Since: since, Deadline: since.Add(5 * time.Minute),
			Memory: 3 << 20, Disk: 200 << 20},
		Updated: time.Now(),
	}
	var out bytes.Buffer
	writeStatus(&out, l, Running, st, nil)
	text := out.String()
	for _, want := range []string{"connecting to the engine (not attached)", "2 call(s) held through an outage since 14:00:00 (c1, c2)",
		"3 MiB in memory", "200 MiB on disk", "stopped at 14:05:00 unless the engine claims them"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	st.Held = nil
	out.Reset()
	writeStatus(&out, l, Running, st, nil)
	if strings.Contains(out.String(), "held") {
		t.Errorf("status mentions held calls when there are none:\n%s", out.String())
	}
}
