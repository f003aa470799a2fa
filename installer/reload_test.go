package installer

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/status"
)

// TestReloadApplies: install reloads a running service only when the unit
// it runs under already reloads and would not change but for the stop
// timeout; otherwise a restart is the only way the change takes effect.
func TestReloadApplies(t *testing.T) {
	p := serviceParams{Executable: "/usr/bin/fluksio-worker", ConfigPath: "/etc/fluksio-worker/config.toml", Account: "fluksio-worker", CancelGrace: 3 * time.Second}
	render := func(p serviceParams) string {
		t.Helper()
		text, err := renderUnit(p, false)
		if err != nil {
			t.Fatal(err)
		}
		return text
	}
	old := render(p)
	longer := p
	longer.CancelGrace = time.Minute
	otherUser := p
	otherUser.Account = "alice"
	otherUser.WritableHome = "/home/alice"
	withoutReload := strings.Replace(old, "\nExecReload=", "\n#ExecReload=", 1)
	for _, tt := range []struct {
		name     string
		old, new string
		want     bool
	}{
		{"same unit", old, old, true},
		{"only the stop timeout changes", old, render(longer), true},
		{"another account", old, render(otherUser), false},
		{"a worker from before reloads", withoutReload, old, false},
	} {
		if got := reloadApplies(tt.old, tt.new); got != tt.want {
			t.Errorf("%s: reloadApplies = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestStatusShowsAWaitingReload: status says a reload waits, for which
// calls, and whether --reload-timeout will stop them.
func TestStatusShowsAWaitingReload(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	st := status.Status{
		PID: 4711, Version: "1.2.3", State: "reloading", Name: "gpu-box", CallsRunning: 2,
		Reload:  &status.Reload{Since: time.Now().Add(-time.Minute), Waiting: []string{"c1", "c7"}},
		Updated: time.Now(),
	}
	var out bytes.Buffer
	writeStatus(&out, l, Running, st, nil)
	for _, want := range []string{`reloading as "gpu-box"`, "asked 1m0s ago", "waiting for c1, c7 to finish", "no time limit"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	st.Reload.Deadline = time.Now().Add(time.Hour)
	out.Reset()
	writeStatus(&out, l, Running, st, nil)
	if !strings.Contains(out.String(), "are stopped (--reload-timeout)") {
		t.Errorf("status does not say when --reload-timeout stops the calls:\n%s", out.String())
	}
}
