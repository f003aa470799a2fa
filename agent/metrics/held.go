package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// What became of a call held through an outage (the resume extension).
const (
	HeldResumed   = "resumed"   // the engine claimed it: replayed, then live
	HeldCancelled = "cancelled" // the engine cancelled it on reconnection
	HeldStopped   = "stopped"   // stopped: unclaimed, past --outage-grace, or the worker stopping
)

// HeldResults are the values of the result label of held_calls_total.
var HeldResults = []string{HeldResumed, HeldCancelled, HeldStopped}

type heldMetrics struct {
	calls   prometheus.Gauge
	oldest  prometheus.Gauge
	bytes   *prometheus.GaugeVec   // where: memory, disk
	results *prometheus.CounterVec // result
}

func newHeldMetrics(f factory) heldMetrics {
	h := heldMetrics{
		calls: f.gauge("calls_held",
			"Calls running through an outage of the connection to the engine (resume extension), their output kept for the engine."),
		oldest: f.gauge("held_seconds",
			"How long the call held longest has been held through the outage; 0 with none held."),
		bytes: f.gaugeVec("held_output_bytes",
			"Bytes of output kept for held calls, by where it is kept: memory, or disk (spill files in the state directory).", "where"),
		results: f.counterVec("held_calls_total",
			"Calls held through an outage, by what became of them: resumed, cancelled (by the engine), stopped (unclaimed, past --outage-grace, or the worker stopping).", "result"),
	}
	for _, r := range HeldResults {
		h.results.WithLabelValues(r)
	}
	h.bytes.WithLabelValues("memory")
	h.bytes.WithLabelValues("disk")
	return h
}

// SetHeld sets how many calls are held, for how long the oldest hold, and
// how much output they keep.
func (m *Metrics) SetHeld(calls int, oldest time.Duration, memory, disk int64) {
	if m != nil {
		m.held.calls.Set(float64(calls))
		m.held.oldest.Set(oldest.Seconds())
		m.held.bytes.WithLabelValues("memory").Set(float64(memory))
		m.held.bytes.WithLabelValues("disk").Set(float64(disk))
	}
}

// HeldEnded counts what became of a held call.
func (m *Metrics) HeldEnded(result string) {
	if m != nil {
		m.held.results.WithLabelValues(result).Inc()
	}
}
