package agent

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
)

func monitoredAgent(t *testing.T) *Agent {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.URL = "wss://engine.example.com/api/v1/workers/attach?token=s3cret-tok"
	cfg.Token = "s3cret-tok"
	cfg.HealthGrace = time.Minute
	return New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), "/usr/bin/python3", t.TempDir())
}

// Each state /healthz can be in, with the clock moved by hand.
func TestHealthStates(t *testing.T) {
	a := monitoredAgent(t)
	now := time.Now()
	// at is /healthz d from now, with the main loop pulsing meanwhile.
	at := func(d time.Duration) (bool, string) {
		a.loopBeat.Store(now.Add(d).UnixNano())
		return a.health(now.Add(d))
	}

	ok, why := at(0)
	if ok || !strings.Contains(why, "not attached to") || !strings.Contains(why, "yet") {
		t.Errorf("before the first welcome: %v %q; want unhealthy, not attached yet", ok, why)
	}

	a.status.Update(func(s *status.Status) { s.State, s.Name = "attached", "gpu-01" })
	if ok, why := at(0); !ok || !strings.HasPrefix(why, `ok: attached as "gpu-01" to wss://engine.example.com/`) {
		t.Errorf("attached: %v %q", ok, why)
	}

	// The connection is lost: healthy within the grace, not after.
	a.detachedAt.Store(now.UnixNano())
	a.status.Update(func(s *status.Status) {
		s.State, s.Name, s.LastError = "connecting", "", "connecting to "+logging.ShownURL(a.cfg.URL)+": refused (token s3cret-tok)"
	})
	if ok, why := at(30 * time.Second); !ok || !strings.Contains(why, "reconnecting") {
		t.Errorf("30 s after a loss, within a grace of 1 min: %v %q", ok, why)
	}
	ok, why = at(90 * time.Second)
	if ok || !strings.Contains(why, "for 1m30s (over --health-grace 1m0s)") {
		t.Errorf("90 s after a loss: %v %q", ok, why)
	}
	// The reason never carries the token, wherever it came from.
	if _, why := a.Health(); strings.Contains(why, "s3cret-tok") {
		t.Errorf("/healthz shows the token: %q", why)
	}

	// A main loop that stopped pulsing is unhealthy, attached or not.
	a.status.Update(func(s *status.Status) { s.State, s.Name = "attached", "gpu-01" })
	a.loopBeat.Store(now.UnixNano())
	if ok, why := a.health(now.Add(loopStale + time.Second)); ok || !strings.Contains(why, "main loop has not run") {
		t.Errorf("without a pulse for over %s: %v %q", loopStale, ok, why)
	}
}

// /livez follows only the main loop: not attached yet, attached, and gone
// past the grace are all alive; a loop that stopped pulsing is not.
func TestLiveIgnoresTheEngine(t *testing.T) {
	a := monitoredAgent(t)
	now := time.Now()
	a.loopBeat.Store(now.UnixNano())
	if ok, why := a.looping(now); !ok || why != "ok: the worker's main loop runs" {
		t.Errorf("not attached yet: %v %q; want alive", ok, why)
	}
	a.status.Update(func(s *status.Status) { s.State, s.Name = "attached", "gpu-01" })
	a.detachedAt.Store(now.Add(-time.Hour).UnixNano())
	a.status.Update(func(s *status.Status) { s.State, s.Name, s.LastError = "connecting", "", "refused" })
	if ok, _ := a.health(now); ok {
		t.Error("an hour after a loss /healthz should be unhealthy")
	}
	if ok, why := a.looping(now); !ok {
		t.Errorf("an hour after a loss: %v %q; want alive (the engine's outage is not the worker's)", ok, why)
	}
	if ok, why := a.looping(now.Add(loopStale + time.Second)); ok || !strings.Contains(why, "main loop has not run") {
		t.Errorf("without a pulse for over %s: %v %q; want not alive", loopStale, ok, why)
	}
}

func TestStatusLine(t *testing.T) {
	engine := "wss://engine.example.com/api/v1/workers/attach?token=REDACTED"
	for _, tc := range []struct {
		st   status.Status
		want string
	}{
		{status.Status{State: "attached", Name: "gpu-01", Engine: engine}, `attached as "gpu-01" to ` + engine + "; calls: 2 running, 7 done"},
		{status.Status{State: "draining", Name: "gpu-01", Engine: engine}, `draining, attached as "gpu-01" to ` + engine + "; calls: 2 running, 7 done"},
		{status.Status{State: "connecting", Engine: engine, LastError: "connection lost: EOF\nmore"}, "not attached to " + engine + ", retrying: connection lost: EOF; calls: 2 running, 7 done"},
		{status.Status{State: "connecting", Engine: engine}, "connecting to " + engine + "; calls: 2 running, 7 done"},
		{status.Status{State: "draining", Engine: engine, LastError: "connection lost: EOF"}, "draining, not attached to " + engine + ", retrying: connection lost: EOF; calls: 2 running, 7 done"},
		{status.Status{State: "refused", Engine: engine, LastError: "the engine refused this worker: pool full"}, "refused by " + engine + ": the engine refused this worker: pool full; calls: 2 running, 7 done"},
	} {
		if got := statusLine(tc.st, 2, 7); got != tc.want {
			t.Errorf("%+v:\n got %q\nwant %q", tc.st, got, tc.want)
		}
	}
}

func TestAnswerOutcome(t *testing.T) {
	for answer, want := range map[string]string{
		`{"call_id":"c","ok":true,"outputs":{}}`:                                     "ok",
		`{"call_id":"c","ok":false,"error":{"type":"ValueError","message":"x"}}`:     "error",
		`{"call_id":"c","ok":false,"error":{"type":"NodeCancelled","message":"x"}}`:  "cancelled",
		`{"call_id":"c","error":{"message":"x","type":"NodeCancelled"},"ok":false}`:  "cancelled",
		`{"call_id":"c","ok":false,"error":{"type":"NodeCancelledX","message":"x"}}`: "error",
		`{"call_id":"c","ok":1}`:      "ok",
		`{"call_id":"c","error":"x"}`: "error",
		`{"call_id":"c"}`:             "error",
	} {
		if got := answerOutcome([]byte(answer)); got != want {
			t.Errorf("%s: %s, want %s", answer, got, want)
		}
	}
}
