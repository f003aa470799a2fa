package metrics

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// series reads one series from the registry by name and labels; ok is
// false when it is not there.
func series(t *testing.T, m *Metrics, name string, labels map[string]string) (*dto.Metric, bool) {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, s := range f.GetMetric() {
			if len(s.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range s.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return s, true
		}
	}
	return nil, false
}

// value is a counter's or gauge's value, or a histogram's count.
func value(t *testing.T, m *Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	s, ok := series(t, m, name, labels)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return s.GetCounter().GetValue() + s.GetGauge().GetValue() + float64(s.GetHistogram().GetSampleCount())
}

// Every label combination is there from the start, at zero, so rates and
// alerts work before the first event.
func TestSeriesExistFromTheStart(t *testing.T) {
	m := New("1.2.3", 7)
	if v := value(t, m, "fluksio_worker_build_info", map[string]string{"version": "1.2.3", "protocol": "7"}); v != 1 {
		t.Errorf("build_info = %v; want 1", v)
	}
	for _, op := range Ops {
		if v := value(t, m, "fluksio_worker_calls_started_total", map[string]string{"op": op}); v != 0 {
			t.Errorf("calls_started_total{op=%q} = %v at start", op, v)
		}
		for _, outcome := range Outcomes {
			labels := map[string]string{"op": op, "outcome": outcome}
			value(t, m, "fluksio_worker_calls_finished_total", labels)
			value(t, m, "fluksio_worker_call_duration_seconds", labels)
		}
	}
	for _, reason := range DeclineReasons {
		value(t, m, "fluksio_worker_calls_declined_total", map[string]string{"reason": string(reason)})
	}
	for _, name := range []string{"go_goroutines", "process_open_fds"} {
		if _, ok := series(t, m, name, map[string]string{}); !ok {
			t.Errorf("no %s: the Go and process collectors are missing", name)
		}
	}
}

func TestHooksCountWhatHappened(t *testing.T) {
	m := New("dev", 1)
	m.AttachAttempt()
	m.AttachAttempt()
	m.Welcomed()
	m.Refused()
	m.CallStarted("run")
	m.CallStarted("fly") // an op the worker does not know
	m.CallFinished("run", OutcomeOK, 1500*time.Millisecond)
	m.CallFinished("compile", OutcomeCancelled, time.Second)
	m.CallDeclined(DeclinedQueueFull)
	m.SetRunning(3)
	m.SetQueued(5)
	m.EventRelayed(10)
	m.EventRelayed(20)
	m.AnswerRelayed(100)
	m.RunnerStarted(5 * time.Millisecond)
	m.HeartbeatSent()
	m.StderrLineDropped()
	m.SetWarmRunners(2)
	m.WarmHit()
	m.WarmMiss()
	m.WarmMiss()
	none := map[string]string{}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"fluksio_worker_attach_attempts_total", none, 2},
		{"fluksio_worker_welcomes_total", none, 1},
		{"fluksio_worker_connected", none, 1},
		{"fluksio_worker_refusals_total", none, 1},
		{"fluksio_worker_calls_started_total", map[string]string{"op": "run"}, 1},
		{"fluksio_worker_calls_started_total", map[string]string{"op": "other"}, 1},
		{"fluksio_worker_calls_finished_total", map[string]string{"op": "run", "outcome": OutcomeOK}, 1},
		{"fluksio_worker_call_duration_seconds", map[string]string{"op": "compile", "outcome": OutcomeCancelled}, 1},
		{"fluksio_worker_calls_declined_total", map[string]string{"reason": string(DeclinedQueueFull)}, 1},
		{"fluksio_worker_calls_running", none, 3},
		{"fluksio_worker_calls_queued", none, 5},
		{"fluksio_worker_events_relayed_total", none, 2},
		{"fluksio_worker_relayed_bytes_total", none, 130},
		{"fluksio_worker_runner_start_seconds", none, 1},
		{"fluksio_worker_heartbeats_sent_total", none, 1},
		{"fluksio_worker_runner_stderr_dropped_lines_total", none, 1},
		{"fluksio_worker_warm_runners", none, 2},
		{"fluksio_worker_warm_runner_hits_total", none, 1},
		{"fluksio_worker_warm_runner_misses_total", none, 2},
	} {
		if got := value(t, m, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	s, _ := series(t, m, "fluksio_worker_call_duration_seconds", map[string]string{"op": "run", "outcome": OutcomeOK})
	if sum := s.GetHistogram().GetSampleSum(); sum != 1.5 {
		t.Errorf("call_duration_seconds sum = %v; want 1.5", sum)
	}
	m.Disconnected()
	if v := value(t, m, "fluksio_worker_connected", none); v != 0 {
		t.Errorf("connected = %v after a disconnect", v)
	}
	if v := value(t, m, "fluksio_worker_disconnects_total", none); v != 1 {
		t.Errorf("disconnects_total = %v", v)
	}
}

// A worker without --listen holds a nil *Metrics: every hook is a no-op.
func TestNilMetricsAreSafe(t *testing.T) {
	var m *Metrics
	m.AttachAttempt()
	m.Welcomed()
	m.Refused()
	m.Disconnected()
	m.CallStarted("run")
	m.CallFinished("run", OutcomeOK, time.Second)
	m.CallDeclined(DeclinedDraining)
	m.SetRunning(1)
	m.SetQueued(1)
	m.EventRelayed(1)
	m.AnswerRelayed(1)
	m.RunnerStarted(time.Second)
	m.HeartbeatSent()
	m.StderrLineDropped()
	m.SetWarmRunners(1)
	m.WarmHit()
	m.WarmMiss()
}

func get(t *testing.T, method, url string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestServerServesMetricsAndHealth(t *testing.T) {
	m := New("9.9.9", 1)
	m.Welcomed()
	healthy, reason := true, "ok: attached"
	alive := true
	srv, err := Listen("127.0.0.1:0", m, func() (bool, string) { return healthy, reason },
		func() (bool, string) { return alive, "the main loop runs" }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	base := "http://" + srv.Addr()

	code, _, body := get(t, http.MethodGet, base+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `fluksio_worker_build_info{protocol="1",version="9.9.9"} 1`) ||
		!strings.Contains(body, "fluksio_worker_connected 1") {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	code, header, body := get(t, http.MethodGet, base+"/healthz")
	if code != http.StatusOK || body != "ok: attached\n" || header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET /healthz while healthy: %d %q %v", code, body, header)
	}
	healthy, reason = false, "not attached to the engine yet"
	if code, _, body = get(t, http.MethodGet, base+"/healthz"); code != http.StatusServiceUnavailable || body != reason+"\n" {
		t.Errorf("GET /healthz while unhealthy: %d %q", code, body)
	}
	if code, _, body = get(t, http.MethodHead, base+"/healthz"); code != http.StatusServiceUnavailable || body != "" {
		t.Errorf("HEAD /healthz: %d %q; want 503 without a body", code, body)
	}
	// Liveness is the main loop's alone, whatever the engine does.
	if code, _, body = get(t, http.MethodGet, base+"/livez"); code != http.StatusOK || body != "the main loop runs\n" {
		t.Errorf("GET /livez while alive, not ready: %d %q", code, body)
	}
	alive = false
	if code, _, _ = get(t, http.MethodGet, base+"/livez"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /livez while stuck: %d; want 503", code)
	}
	// The endpoint changes nothing, and says so.
	for _, path := range []string{"/metrics", "/healthz", "/livez"} {
		for _, method := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
			code, header, _ := get(t, method, base+path)
			if code != http.StatusMethodNotAllowed || header.Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: %d, Allow %q; want 405 and GET, HEAD", method, path, code, header.Get("Allow"))
			}
		}
	}
	if code, _, _ := get(t, http.MethodGet, base+"/"); code != http.StatusNotFound {
		t.Errorf("GET /: %d; want 404", code)
	}
	srv.Close()
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the endpoint still answers after Close")
	}
}

// An address that cannot be bound is an error at once, naming --listen.
func TestListenOnABusyAddress(t *testing.T) {
	m := New("dev", 1)
	ok := func() (bool, string) { return true, "" }
	srv, err := Listen("127.0.0.1:0", m, ok, ok, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := Listen(srv.Addr(), m, ok, ok, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--listen "+srv.Addr()) {
		t.Errorf("Listen on a busy address: %v; want an error naming --listen", err)
	}
}
