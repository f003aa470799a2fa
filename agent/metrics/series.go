package metrics

import "github.com/prometheus/client_golang/prometheus"

// decl declares one of the worker's own metrics, declared once in table:
// New registers it from here, /metrics serves it and the README's table
// is written from the registry (readme_test.go at the root), so its name, type, labels and
// help are written nowhere else.
type decl struct {
	// into is the Metrics field New sets: a *prometheus.Counter, Gauge or
	// Histogram, or a **prometheus.CounterVec, GaugeVec or HistogramVec;
	// its type is the series' type.
	into    any
	name    string // without the Namespace prefix
	help    string
	labels  []string  // the Vec's labels
	buckets []float64 // a histogram's
}

// table declares every series of the worker's own (the Go runtime's and
// the process's come from their collectors).
func (m *Metrics) table() []decl {
	return []decl{
		{into: &m.buildInfo, name: "build_info", help: "Always 1; the labels say which worker this is.", labels: []string{"version", "protocol"}},
		{into: &m.connected, name: "connected",
			help: "1 while the worker is attached to the engine (welcomed), else 0."},
		{into: &m.attachAttempts, name: "attach_attempts_total",
			help: "Attempts to attach: each fetches the runner if the engine serves one, dials, says hello and waits for the welcome."},
		{into: &m.welcomes, name: "welcomes_total",
			help: "Times the engine welcomed this worker."},
		{into: &m.refusals, name: "refusals_total",
			help: "Times the engine refused this worker (a refusal answer, or HTTP 401/403); the worker then exits 1."},
		{into: &m.disconnects, name: "disconnects_total",
			help: "Connections lost after a welcome (the worker's own close when it stops is not counted)."},
		{into: &m.callsStarted, name: "calls_started_total",
			help: "Calls whose runner the worker started (or tried to), by op.", labels: []string{"op"}},
		{into: &m.callsFinished, name: "calls_finished_total",
			help: "Calls that ended, by op and outcome: ok, error (an error answer, or none), cancelled (by the engine, a stop, or a lost connection).", labels: []string{"op", "outcome"}},
		{into: &m.callDuration, name: "call_duration_seconds",
			help: "Time from a call's start to its end, by op and outcome.", buckets: callBuckets, labels: []string{"op", "outcome"}},
		{into: &m.callsDeclined, name: "calls_declined_total",
			help: "Calls answered with an error without running, by reason: stopping, draining (SIGQUIT or --max-calls), reloading (SIGHUP), queue_full (the waiting queue is at its bound), cancelled (cancelled, stopped or dropped while waiting for a slot), invalid (duplicate call_id, bad request), policy (the code policy refused it), hook (the pre-call hook declined it), disk (less than --min-free-disk free where calls write).", labels: []string{"reason"}},
		{into: &m.callsRunning, name: "calls_running",
			help: "Calls running now."},
		{into: &m.callsQueued, name: "calls_queued",
			help: "Calls accepted and waiting for a free slot of --parallel."},
		{into: &m.eventsRelayed, name: "events_relayed_total",
			help: "Event lines (progress, stream values, logs) forwarded from runners to the engine."},
		{into: &m.bytesRelayed, name: "relayed_bytes_total",
			help: "Bytes of runner lines (events and answers) forwarded to the engine."},
		{into: &m.runnerStart, name: "runner_start_seconds",
			help: "Time to start a call's runner process (pipes, fork and exec of the interpreter).", buckets: startBuckets},
		{into: &m.heartbeats, name: "heartbeats_sent_total",
			help: "Heartbeats sent to the engine for running calls (one per call every 10 s)."},
		{into: &m.stderrDropped, name: "runner_stderr_dropped_lines_total",
			help: "Lines runners and their nodes wrote that were not logged, over the budget of 1000 a second per call (each; the node's lines still reach the engine as budgeted log events)."},
		{into: &m.warmRunners, name: "warm_runners",
			help: "Spare runners started and waiting for a call (--warm), not counting those still starting."},
		{into: &m.warmHits, name: "warm_runner_hits_total",
			help: "Calls handed a spare runner: no interpreter start."},
		{into: &m.held.calls, name: "calls_held",
			help: "Calls running through an outage of the connection to the engine (resume extension), their output kept for the engine."},
		{into: &m.held.oldest, name: "held_seconds",
			help: "How long the call held longest has been held through the outage; 0 with none held."},
		{into: &m.held.bytes, name: "held_output_bytes",
			help: "Bytes of output kept for held calls, by where it is kept: memory, or disk (spill files in the state directory).", labels: []string{"where"}},
		{into: &m.held.results, name: "held_calls_total",
			help: "Calls held through an outage, by what became of them: resumed, cancelled (by the engine), stopped (unclaimed, past --outage-grace, or the worker stopping).", labels: []string{"result"}},
		{into: &m.warmMisses, name: "warm_runner_misses_total",
			help: "Calls with --warm above 0 that started their runner cold: no fresh spare of their environment was ready."},
	}
}

// register makes s, sets its Metrics field and registers it on r.
func (s decl) register(r *prometheus.Registry) {
	var c prometheus.Collector
	switch into := s.into.(type) {
	case *prometheus.Counter:
		*into = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: s.name, Help: s.help})
		c = *into
	case **prometheus.CounterVec:
		*into = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: s.name, Help: s.help}, s.labels)
		c = *into
	case *prometheus.Gauge:
		*into = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: s.name, Help: s.help})
		c = *into
	case **prometheus.GaugeVec:
		*into = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: s.name, Help: s.help}, s.labels)
		c = *into
	case *prometheus.Histogram:
		*into = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: s.name, Help: s.help, Buckets: s.buckets})
		c = *into
	case **prometheus.HistogramVec:
		*into = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: s.name, Help: s.help, Buckets: s.buckets}, s.labels)
		c = *into
	default:
		panic("metrics: series " + s.name + " goes into a field of no metric type")
	}
	r.MustRegister(c)
}
