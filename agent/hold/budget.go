package hold

import "sync"

// Budget bounds the spill files of many journals together: a worker's held
// calls (--held-disk-max), each also within its own Limits.Disk. A journal
// whose next frame would take the spill files past it waits, as it does
// at its own bound, until a replay, a discard or a close gives bytes back.
type Budget struct {
	max int64

	mu   sync.Mutex
	used int64
	// gen changes whenever bytes are given back or a journal's own state
	// changes (kick): what a journal waiting for room waits for.
	gen     uint64
	changed *sync.Cond
}

// NewBudget bounds spill files together to max bytes.
func NewBudget(max int64) *Budget {
	b := &Budget{max: max}
	b.changed = sync.NewCond(&b.mu)
	return b
}

// take reserves n bytes and reports true, or reports false with the
// generation to wait past. A nil Budget bounds nothing.
func (b *Budget) take(n int64) (bool, uint64) {
	if b == nil {
		return true, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false, b.gen
	}
	b.used += n
	return true, 0
}

// give returns n bytes and wakes the journals waiting for room.
func (b *Budget) give(n int64) {
	if b == nil || n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.gen++
	b.changed.Broadcast()
	b.mu.Unlock()
}

// kick wakes the journals waiting for room: one of them may have been
// given a connection, or closed.
func (b *Budget) kick() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.gen++
	b.changed.Broadcast()
	b.mu.Unlock()
}

// wait returns once the generation is past gen.
func (b *Budget) wait(gen uint64) {
	b.mu.Lock()
	for b.gen == gen {
		b.changed.Wait()
	}
	b.mu.Unlock()
}
