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
