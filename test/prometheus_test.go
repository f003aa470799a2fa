package test

// The alert rules and the Grafana dashboard shipped in packaging/monitoring,
// against Debian's Prometheus: promtool checks and unit-tests the rules, and
// a real Prometheus on loopback scrapes a real worker, loads the rules and
// answers the dashboard's queries.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// monitoringDir holds the rules and the dashboard, relative to the module root.
const monitoringDir = "packaging/monitoring"

// needPrometheus finds Debian's prometheus and promtool: skipped without
// them, failed under CI (which installs them).
func needPrometheus(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"prometheus", "promtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing in CI (Debian: apt-get install prometheus)", tool)
			}
			t.Skipf("%s not installed (Debian: apt-get install prometheus)", tool)
		}
	}
}

// TestAlertRules: promtool accepts the rule file and its unit tests pass
// (each alert fires on the series that should fire it, with its text).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	needPrometheus(t)
	dir := filepath.Join(moduleRoot(t), monitoringDir)
	runTool(t, dir, nil, "promtool", "check", "rules", "fluksio-worker.rules.yaml")
	runTool(t, dir, nil, "promtool", "test", "rules", "fluksio-worker.rules.test.yaml")
}

// TestPrometheusScrapesTheWorker: a real Prometheus (a temporary config
// and data directory, on loopback) scrapes a worker that ran calls: the
// target is up, the rules load, a query for the calls counter returns the
// calls the test made, and every query of the Grafana dashboard is valid
// PromQL that Prometheus answers, naming only series the worker exports.
func TestPrometheusScrapesTheWorker(t *testing.T) {
	t.Parallel()
	needPrometheus(t)
	dir := filepath.Join(moduleRoot(t), monitoringDir)
	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--listen", "127.0.0.1:0")
	addr := monitorAddr(t, w)
	wk := attach(t, eng)
	const calls = 3
	for i := range calls {
		answer, _ := wait(t, run(t, wk, fmt.Sprintf("c%d", i), step{"sleep_ms": 10}))
		if !answer.OK {
			t.Fatalf("call %d: %s", i, answer.Raw)
		}
	}
	answer, _ := wait(t, run(t, wk, "failing", step{"exit": 3}))
	if answer.OK {
		t.Fatalf("the failing call answered ok: %s", answer.Raw)
	}

	data := t.TempDir()
	config := filepath.Join(data, "prometheus.yml")
	rules, err := filepath.Abs(filepath.Join(dir, "fluksio-worker.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: fluksio-worker
    static_configs:
      - targets: [%q]
`, rules, addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	web := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	prom := startProgram(t, "prometheus", nil, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(data, "tsdb"),
		"--web.listen-address="+web, "--log.level=warn")
	api := "http://" + web + "/api/v1/"

	eventually(t, 60*time.Second, "Prometheus to scrape the worker (target up)", func() bool {
		var targets struct {
			ActiveTargets []struct {
				Health string `json:"health"`
				Labels struct {
					Job string `json:"job"`
				} `json:"labels"`
			} `json:"activeTargets"`
		}
		if promAPI(api+"targets", &targets) != nil {
			return false
		}
		return len(targets.ActiveTargets) == 1 && targets.ActiveTargets[0].Health == "up" && targets.ActiveTargets[0].Labels.Job == "fluksio-worker"
	})
	want := fmt.Sprintf("cancelled=0 error=1 ok=%d", calls)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var v vector
		err := promAPI(api+"query?query="+url.QueryEscape(`sum by (outcome) (fluksio_worker_calls_finished_total{job="fluksio-worker",op="run"})`), &v)
		if err == nil && v.String() == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus' calls counter says %q (%v), want %q", v.String(), err, want)
		}
	}

	var groups struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name   string `json:"name"`
				Health string `json:"health"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := promAPI(api+"rules", &groups); err != nil || len(groups.Groups) != 1 || len(groups.Groups[0].Rules) != 5 {
		t.Errorf("Prometheus loaded rules %+v (%v); want the one group of 5", groups, err)
	}

	// The dashboard's queries, with Grafana's variables filled in.
	b, err := os.ReadFile(filepath.Join(dir, "fluksio-worker-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("the dashboard: %v (uid %q, %d panels)", err, dash.UID, len(dash.Panels))
	}
	exported := exportedNames(t, addr)
	metricName := regexp.MustCompile(`\b(fluksio_worker_[a-z_]+|process_[a-z_]+)\b`)
	fill := strings.NewReplacer("$__rate_interval", "1m", "$instance", ".*")
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, name := range metricName.FindAllString(tg.Expr, -1) {
				if !exported[strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum")] {
					t.Errorf("panel %q queries %s, which the worker does not export", p.Title, name)
				}
			}
			var v vector
			if err := promAPI(api+"query?query="+url.QueryEscape(fill.Replace(tg.Expr)), &v); err != nil {
				t.Errorf("panel %q: %s: %v", p.Title, tg.Expr, err)
			}
		}
	}
	prom.signal(syscall.SIGTERM)
	if code := prom.wait(30 * time.Second); code != 0 {
		t.Errorf("prometheus exited %d:\n%s", code, prom.logs.String())
	}
}

// exportedNames is the set of metric families the worker at addr exports.
func exportedNames(t *testing.T, addr string) map[string]bool {
	names := map[string]bool{}
	for name := range scrape(t, addr) {
		names[name] = true
	}
	return names
}

// vector is an instant query's result.
type vector []struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// String is "label=value" per series, sorted, for a one-label vector.
func (v vector) String() string {
	var parts []string
	for _, s := range v {
		var label string
		for _, l := range s.Metric {
			label = l
		}
		parts = append(parts, fmt.Sprintf("%s=%v", label, s.Value[1]))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// promAPI GETs a Prometheus API URL and decodes its data into out; an
// error status is an error with Prometheus' message.
func promAPI(u string, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	raw := json.NewDecoder(resp.Body)
	var all json.RawMessage
	if err := raw.Decode(&all); err != nil {
		return err
	}
	if err := json.Unmarshal(all, &body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", body.Status, body.Error)
	}
	if body.Data.ResultType != "" {
		return json.Unmarshal(body.Data.Result, out)
	}
	var data struct {
		Data json.RawMessage `json:"data"`
	}
	json.Unmarshal(all, &data)
	return json.Unmarshal(data.Data, out)
}
