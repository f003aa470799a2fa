// Package metrics is what the worker tells a monitoring system: its
// Prometheus metrics, kept on a registry of its own, and the HTTP endpoint
// that serves them with /healthz on --listen.
//
// The agent calls one method per event (Welcomed, CallFinished, ...). Every
// method is safe on a nil *Metrics, which is what a worker without --listen
// holds: no series are kept and the hooks cost a nil check.
//
// Labels take only values from small fixed sets (op, outcome, reason):
// never a call id, a node name or anything else that grows without bound.
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric of the worker's own.
const Namespace = "fluksio_worker"

// Label values. A call's op is one of Ops; how it ended is one of Outcomes;
// why a call was declined without running is one of DeclineReasons.
var (
	Ops            = []string{"run", "compile"}
	Outcomes       = []string{OutcomeOK, OutcomeError, OutcomeCancelled}
	DeclineReasons = []DeclineReason{DeclinedStopping, DeclinedDraining, DeclinedReloading, DeclinedQueueFull, DeclinedCancelled, DeclinedInvalid, DeclinedPolicy, DeclinedHook, DeclinedDisk}
)

const (
	OutcomeOK        = "ok"        // the runner answered "ok": true
	OutcomeError     = "error"     // any other answer, or none (the runner died, a line was too long)
	OutcomeCancelled = "cancelled" // the engine cancelled it, the worker stopped, or the connection was lost

)

// DeclineReason is why a call was declined without running: the reason
// label of calls_declined_total. It is chosen where the call is declined,
// never read back from the answer's text.
type DeclineReason string

const (
	DeclinedStopping  DeclineReason = "stopping"   // the worker is stopping
	DeclinedDraining  DeclineReason = "draining"   // SIGQUIT, or --max-calls reached
	DeclinedReloading DeclineReason = "reloading"  // SIGHUP: a reload waits for the running calls
	DeclinedQueueFull DeclineReason = "queue_full" // every --parallel slot busy and the waiting queue full
	DeclinedCancelled DeclineReason = "cancelled"  // cancelled, stopped or dropped while waiting for a slot
	DeclinedInvalid   DeclineReason = "invalid"    // a duplicate call_id or a request that cannot be run
	DeclinedPolicy    DeclineReason = "policy"     // the code policy refused its code or its env (PolicyRefused)
	DeclinedHook      DeclineReason = "hook"       // the pre-call hook declined it
	DeclinedDisk      DeclineReason = "disk"       // less than --min-free-disk free where calls write
)

// Histogram buckets, in seconds. Calls run from a compile of a few
// milliseconds to training loops of hours; a runner starts in a few
// milliseconds (a compiled stand-in) to seconds (a cold Python on a busy
// machine).
var (
	callBuckets  = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600}
	startBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
)

// Metrics holds every series the worker exports. Each field is declared
// (name, type, labels, help) in table (series.go), and nowhere else.
type Metrics struct {
	registry *prometheus.Registry

	buildInfo *prometheus.GaugeVec // version, protocol

	connected      prometheus.Gauge
	attachAttempts prometheus.Counter
	welcomes       prometheus.Counter
	refusals       prometheus.Counter
	disconnects    prometheus.Counter

	callsStarted  *prometheus.CounterVec   // op
	callsFinished *prometheus.CounterVec   // op, outcome
	callDuration  *prometheus.HistogramVec // op, outcome
	callsDeclined *prometheus.CounterVec   // reason
	callsRunning  prometheus.Gauge
	callsQueued   prometheus.Gauge

	eventsRelayed prometheus.Counter
	bytesRelayed  prometheus.Counter
	runnerStart   prometheus.Histogram
	heartbeats    prometheus.Counter
	stderrDropped prometheus.Counter

	warmRunners prometheus.Gauge
	warmHits    prometheus.Counter
	warmMisses  prometheus.Counter

	held heldMetrics // calls held through an outage (held.go)
}

// New makes the worker's registry: the Go runtime and process collectors,
// the build info, and the worker's own series, each label combination
// present from the start (at zero), so rates and alerts work before the
// first event.
func New(version string, protocol int) *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m := &Metrics{registry: r}
	for _, s := range m.table() {
		s.register(r)
	}
	m.buildInfo.WithLabelValues(version, strconv.Itoa(protocol)).Set(1)
	for _, op := range Ops {
		m.callsStarted.WithLabelValues(op)
		for _, outcome := range Outcomes {
			m.callsFinished.WithLabelValues(op, outcome)
			m.callDuration.WithLabelValues(op, outcome)
		}
	}
	for _, reason := range DeclineReasons {
		m.callsDeclined.WithLabelValues(string(reason))
	}
	for _, r := range HeldResults {
		m.held.results.WithLabelValues(r)
	}
	m.held.bytes.WithLabelValues("memory")
	m.held.bytes.WithLabelValues("disk")
	return m
}

// Registry is what /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// AttachAttempt counts an attempt to attach.
func (m *Metrics) AttachAttempt() {
	if m != nil {
		m.attachAttempts.Inc()
	}
}

// Welcomed counts a welcome; the worker is connected.
func (m *Metrics) Welcomed() {
	if m != nil {
		m.welcomes.Inc()
		m.connected.Set(1)
	}
}

// Refused counts a refusal.
func (m *Metrics) Refused() {
	if m != nil {
		m.refusals.Inc()
	}
}

// Disconnected counts a lost connection; the worker is not connected.
func (m *Metrics) Disconnected() {
	if m != nil {
		m.disconnects.Inc()
		m.connected.Set(0)
	}
}

// CallStarted counts a call whose runner is being started.
func (m *Metrics) CallStarted(op string) {
	if m != nil {
		m.callsStarted.WithLabelValues(knownOp(op)).Inc()
	}
}

// CallFinished counts a call's end and observes how long it took.
func (m *Metrics) CallFinished(op, outcome string, took time.Duration) {
	if m != nil {
		op = knownOp(op)
		m.callsFinished.WithLabelValues(op, outcome).Inc()
		m.callDuration.WithLabelValues(op, outcome).Observe(took.Seconds())
	}
}

// CallDeclined counts a call answered without running.
func (m *Metrics) CallDeclined(reason DeclineReason) {
	if m != nil {
		m.callsDeclined.WithLabelValues(string(reason)).Inc()
	}
}

// SetRunning sets how many calls are running.
func (m *Metrics) SetRunning(n int) {
	if m != nil {
		m.callsRunning.Set(float64(n))
	}
}

// SetQueued sets how many accepted calls wait for a free slot.
func (m *Metrics) SetQueued(n int) {
	if m != nil {
		m.callsQueued.Set(float64(n))
	}
}

// EventRelayed counts one event line of n bytes forwarded to the engine.
// It is on the relay's hot path: two atomic adds.
func (m *Metrics) EventRelayed(n int) {
	if m != nil {
		m.eventsRelayed.Inc()
		m.bytesRelayed.Add(float64(n))
	}
}

// AnswerRelayed counts the bytes of a runner's answer forwarded.
func (m *Metrics) AnswerRelayed(n int) {
	if m != nil {
		m.bytesRelayed.Add(float64(n))
	}
}

// RunnerStarted observes how long starting a runner took.
func (m *Metrics) RunnerStarted(took time.Duration) {
	if m != nil {
		m.runnerStart.Observe(took.Seconds())
	}
}

// HeartbeatSent counts a heartbeat.
func (m *Metrics) HeartbeatSent() {
	if m != nil {
		m.heartbeats.Inc()
	}
}

// StderrLineDropped counts a runner stderr line that was not logged.
func (m *Metrics) StderrLineDropped() {
	if m != nil {
		m.stderrDropped.Inc()
	}
}

// knownOp keeps the op label to its known values whatever a message says.
func knownOp(op string) string {
	for _, known := range Ops {
		if op == known {
			return op
		}
	}
	return "other"
}

// SetWarmRunners sets how many spare runners are ready.
func (m *Metrics) SetWarmRunners(n int) {
	if m != nil {
		m.warmRunners.Set(float64(n))
	}
}

// WarmHit counts a call handed a spare runner.
func (m *Metrics) WarmHit() {
	if m != nil {
		m.warmHits.Inc()
	}
}

// WarmMiss counts a call that started its runner cold while spares are on.
func (m *Metrics) WarmMiss() {
	if m != nil {
		m.warmMisses.Inc()
	}
}
