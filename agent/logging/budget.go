package logging

import (
	"log/slog"
	"sync"
	"time"
)

// Budget caps how many lines a source logs per second, so a node that
// prints a million lines, or an engine that sends a million frames the
// worker ignores, cannot flood the service log; what was dropped is
// counted and said once the second is over. Safe for concurrent use.
type Budget struct {
	logger    *slog.Logger
	what      string
	perSecond int

	mu      sync.Mutex
	window  time.Time
	used    int
	dropped int
	report  *time.Timer // says the dropped count when the window ends
}

// NewBudget lets a source log perSecond lines a second through log; what
// names the dropped lines in the count said for them.
func NewBudget(log *slog.Logger, what string, perSecond int) *Budget {
	return &Budget{logger: log, what: what, perSecond: perSecond}
}

// Allow takes a line from the budget. False means the line is dropped
// (and counted): the caller logs only what is allowed, so a flood costs
// no formatting of the lines it drops.
func (b *Budget) Allow() bool {
	b.mu.Lock()
	now := time.Now()
	if now.Sub(b.window) >= time.Second {
		b.reportLocked()
		b.window, b.used = now, 0
	}
	if b.used >= b.perSecond {
		b.dropped++
		if b.report == nil {
			b.report = time.AfterFunc(b.window.Add(time.Second).Sub(now), b.Close)
		}
		b.mu.Unlock()
		return false
	}
	b.used++
	b.mu.Unlock()
	return true
}

// Close says what was dropped, if anything.
func (b *Budget) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reportLocked()
}

func (b *Budget) reportLocked() {
	if b.report != nil {
		b.report.Stop()
		b.report = nil
	}
	if b.dropped > 0 {
		b.logger.Warn(b.what, "dropped", b.dropped)
		b.dropped = 0
	}
}
