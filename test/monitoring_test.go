package test

// The worker as a fleet's monitoring sees it: /metrics scraped and parsed
// as Prometheus parses it, /healthz through an engine outage, the endpoint's
// manners, and --max-calls.

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// monitorAddr is where a worker started with --listen 127.0.0.1:0 serves,
// read from its log.
func monitorAddr(t *testing.T, w *worker) string {
	t.Helper()
	re := regexp.MustCompile(`serving /metrics, /healthz and /livez.* listen=(\S+)`)
	var addr string
	eventually(t, 30*time.Second, "the worker to say where it serves /metrics", func() bool {
		if m := re.FindStringSubmatch(w.logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// get fetches a monitoring URL with method and returns the status and body.
// No body, whatever the answer, may carry the token.
func get(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), testToken) {
		t.Errorf("%s %s shows the token:\n%s", method, url, b)
	}
	return resp.StatusCode, string(b)
}

// scrape fetches /metrics and parses it with Prometheus' own text parser.
type scraped map[string]*dto.MetricFamily

func scrape(t *testing.T, addr string) scraped {
	t.Helper()
	code, body := get(t, "GET", "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: HTTP %d\n%s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v\n%s", err, body)
	}
	return fams
}

// series finds the series of name with exactly these labels.
func (s scraped) series(t *testing.T, name string, labels ...string) *dto.Metric {
	t.Helper()
	fam, ok := s[name]
	if !ok {
		t.Fatalf("/metrics has no %s", name)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, m := range fam.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return m
		}
	}
	t.Fatalf("/metrics has no %s%v", name, want)
	return nil
}

// value is a counter's or a gauge's value.
func (s scraped) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	m := s.series(t, name, labels...)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", name)
	return 0
}

// TestMetricsFollowCalls runs calls of every outcome through the real
// binary and checks what a Prometheus scrape makes of them.
func TestMetricsFollowCalls(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--listen", "127.0.0.1:0", "--parallel", "4", "--cancel-grace", "1s")
	addr := monitorAddr(t, w)
	wk := attach(t, eng)
	// The engine has sent its welcome; the worker reads it a moment later.
	eventually(t, 10*time.Second, "connected to be 1", func() bool {
		return scrape(t, addr).value(t, "fluksio_worker_connected") == 1
	})

	m := scrape(t, addr)
	for name, want := range map[string]float64{
		"fluksio_worker_connected": 1, "fluksio_worker_welcomes_total": 1, "fluksio_worker_attach_attempts_total": 1,
		"fluksio_worker_refusals_total": 0, "fluksio_worker_disconnects_total": 0, "fluksio_worker_calls_running": 0,
		"fluksio_worker_calls_queued": 0, "fluksio_worker_events_relayed_total": 0, "fluksio_worker_heartbeats_sent_total": 0,
	} {
		if got := m.value(t, name); got != want {
			t.Errorf("before any call, %s = %v, want %v", name, got, want)
		}
	}
	if got := m.value(t, "fluksio_worker_build_info", "version", "dev", "protocol", "2"); got != 1 {
		t.Errorf("build_info = %v", got)
	}
	for _, outcome := range []string{"ok", "error", "cancelled"} {
		if got := m.value(t, "fluksio_worker_calls_finished_total", "op", "run", "outcome", outcome); got != 0 {
			t.Errorf("before any call, calls_finished_total{outcome=%q} = %v", outcome, got)
		}
	}
	// The Go and process collectors are on the worker's registry.
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if _, ok := m[name]; !ok {
			t.Errorf("/metrics has no %s", name)
		}
	}

	// ok: five events, then the answer.
	answer, events := wait(t, run(t, wk, "m-ok", step{"events": 5}))
	if !answer.OK || len(events) != 5 {
		t.Fatalf("m-ok: %s after %d events", answer.Raw, len(events))
	}
	eventBytes := 0
	for _, e := range events {
		eventBytes += len(e.Raw)
	}
	// error, twice: a runner that dies without answering, and one that
	// answers ok: false.
	if answer, _ := wait(t, run(t, wk, "m-died", step{"exit": 3})); answer.OK {
		t.Fatalf("m-died: %s", answer.Raw)
	}
	failed := `{"call_id":"m-failed","ok":false,"error":{"type":"ValueError","message":"no","short":"ValueError: no","traceback":""}}`
	if answer, _ := wait(t, run(t, wk, "m-failed", step{"raw": failed})); answer.OK {
		t.Fatalf("m-failed: %s", answer.Raw)
	}
	// A compile that chatters on stderr past the log budget of 1000 lines
	// a second.
	chatter := []step{}
	for i := 0; i < 1300; i++ {
		chatter = append(chatter, step{"stderr": "line"})
	}
	c, err := wk.Run(map[string]any{"op": "compile", "call_id": "m-compile", "steps": chatter})
	if err != nil {
		t.Fatal(err)
	}
	if answer, _ := wait(t, c); !answer.OK {
		t.Fatalf("m-compile: %s", answer.Raw)
	}
	// cancelled: a call that runs long enough for a heartbeat, which the
	// engine then cancels.
	long := run(t, wk, "m-cancel", step{"sleep_ms": 60000})
	eventually(t, 10*time.Second, "calls_running to be 1", func() bool {
		return scrape(t, addr).value(t, "fluksio_worker_calls_running") == 1
	})
	beat, err := long.Next(timeoutCtx(t, 30*time.Second))
	if err != nil || beat.Event != "heartbeat" {
		t.Fatalf("waiting for a heartbeat: %v %s", err, beat.Raw)
	}
	if err := wk.Cancel("m-cancel"); err != nil {
		t.Fatal(err)
	}
	if answer, _ := wait(t, long); answer.OK || answer.Error == nil || answer.Error.Type != "NodeCancelled" {
		t.Fatalf("m-cancel: %s", answer.Raw)
	}

	m = scrape(t, addr)
	for _, tc := range []struct {
		op, outcome string
		want        float64
	}{{"run", "ok", 1}, {"run", "error", 2}, {"run", "cancelled", 1}, {"compile", "ok", 1}, {"compile", "error", 0}} {
		if got := m.value(t, "fluksio_worker_calls_finished_total", "op", tc.op, "outcome", tc.outcome); got != tc.want {
			t.Errorf("calls_finished_total{op=%q,outcome=%q} = %v, want %v", tc.op, tc.outcome, got, tc.want)
		}
		h := m.series(t, "fluksio_worker_call_duration_seconds", "op", tc.op, "outcome", tc.outcome).Histogram
		if h == nil || float64(h.GetSampleCount()) != tc.want {
			t.Errorf("call_duration_seconds{op=%q,outcome=%q} counts %d calls, want %v", tc.op, tc.outcome, h.GetSampleCount(), tc.want)
		}
	}
	if sum := m.series(t, "fluksio_worker_call_duration_seconds", "op", "run", "outcome", "cancelled").Histogram.GetSampleSum(); sum < 9 {
		// The heartbeat is due 10 s after the call arrived; its duration
		// counts from its runner's start, a moment later.
		t.Errorf("the cancelled call ran past a heartbeat (10 s) but its duration sums to %vs", sum)
	}
	for name, want := range map[string]float64{
		"fluksio_worker_calls_running":        0,
		"fluksio_worker_events_relayed_total": 5,
	} {
		if got := m.value(t, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := m.value(t, "fluksio_worker_calls_started_total", "op", "run"); got != 4 {
		t.Errorf("calls_started_total{op=run} = %v, want 4", got)
	}
	if got := m.value(t, "fluksio_worker_calls_started_total", "op", "compile"); got != 1 {
		t.Errorf("calls_started_total{op=compile} = %v, want 1", got)
	}
	if got := m.value(t, "fluksio_worker_relayed_bytes_total"); got < float64(eventBytes) {
		t.Errorf("relayed_bytes_total = %v, less than the %d bytes of events alone", got, eventBytes)
	}
	if got := m.value(t, "fluksio_worker_heartbeats_sent_total"); got < 1 {
		t.Errorf("heartbeats_sent_total = %v after a heartbeat arrived", got)
	}
	if got := m.value(t, "fluksio_worker_runner_stderr_dropped_lines_total"); got < 1 {
		t.Errorf("runner_stderr_dropped_lines_total = %v after 1300 lines in well under a second", got)
	}
	if h := m.series(t, "fluksio_worker_runner_start_seconds").Histogram; h.GetSampleCount() != 5 || h.GetSampleSum() <= 0 {
		t.Errorf("runner_start_seconds: %d starts summing to %vs, want 5 starts", h.GetSampleCount(), h.GetSampleSum())
	}
	// No call id, nor anything else unbounded, became a label.
	for name, fam := range m {
		for _, series := range fam.Metric {
			for _, l := range series.Label {
				if strings.HasPrefix(l.GetValue(), "m-") {
					t.Errorf("%s has the call id %q as its %s label", name, l.GetValue(), l.GetName())
				}
			}
		}
	}
}
