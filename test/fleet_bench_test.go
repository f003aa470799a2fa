package test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// BenchmarkFleetReconnect: a fleet of workers (--warm 0) attached to one
// engine, which restarts. Reported: the time from the engine listening
// again until every worker is attached again (s-to-reattach), and the most
// attach attempts the engine saw in any 100 ms (peak-dials/100ms), from
// the drop on. Not run in CI:
//
//	go test ./test/ -run '^$' -bench FleetReconnect -benchtime 1x
//
// BENCH_FLEET (default 200) workers; BENCH_FLEET_OUTAGE (default 1s) how
// long the engine is down; BENCH_FLEET_BIN another worker binary (an older
// build, for a before and after); FAKERUNNER_FREEZE_MS the CPU each `pip
// freeze` spends (a real one: about 350 ms with 66 packages).
func BenchmarkFleetReconnect(b *testing.B) {
	n := envInt(b, "BENCH_FLEET", 200)
	outage := time.Second
	if v := os.Getenv("BENCH_FLEET_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		outage = d
	}
	bin := os.Getenv("BENCH_FLEET_BIN")
	if bin == "" {
		bin = releaseWorkerBin(b)
	}
	eng := startEngine(b, enginetest.Options{})
	attached := make(chan struct{}, n)
	go func() {
		for {
			if _, err := eng.NextWorker(context.Background()); err != nil {
				return
			}
			attached <- struct{}{}
		}
	}()
	waitAll := func(d time.Duration) {
		b.Helper()
		deadline := time.After(d)
		for i := 0; i < n; i++ {
			select {
			case <-attached:
			case <-deadline:
				b.Fatalf("%d of %d workers attached within %s", i, n, d)
			}
		}
	}
	for i := 0; i < n; i++ {
		startProgram(b, bin, []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
			"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(b), "--runtime", "embedded", "--warm", "0",
			"--state-dir", b.TempDir(), "--name", "fleet-"+strconv.Itoa(i), "--log-level", "error")
	}
	waitAll(5 * time.Minute)
	var took, peak, dials float64
	b.ResetTimer()
	for range b.N {
		before := len(eng.Attempts())
		dropped := time.Now()
		if err := eng.Restart(outage); err != nil {
			b.Fatal(err)
		}
		back := time.Now()
		waitAll(5 * time.Minute)
		took = time.Since(back).Seconds()
		attempts := eng.Attempts()[before:]
		windows := map[int64]int{}
		for _, a := range attempts {
			windows[int64(a.At.Sub(dropped)/(100*time.Millisecond))]++
		}
		peak = 0
		for _, c := range windows {
			peak = max(peak, float64(c))
		}
		dials = float64(len(attempts))
	}
	b.StopTimer()
	b.ReportMetric(took, "s-to-reattach")
	b.ReportMetric(peak, "peak-dials/100ms")
	b.ReportMetric(dials/float64(n), "dials/worker")
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
