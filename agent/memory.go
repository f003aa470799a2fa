package agent

import "runtime/debug"

// gcPercent is the collector's GOGC for `run`, unless the environment sets
// GOGC or GOMEMLIMIT: the heap may grow by half its live size between
// collections instead of all of it. The worker's live heap is small (well
// under 1 MiB between calls), so the default of 100 let a burst of events,
// each a few small allocations, grow it to the collector's 4 MiB minimum
// before every collection, a large part of the worker's peak resident
// memory; at 50 the minimum is 2 MiB, for a few more collections of a
// fraction of a millisecond each. An outsized message, being one
// pointer-free buffer, costs a collection next to nothing to mark, and its
// memory is given back at once anyway (frame.Release).
const gcPercent = 50

// tuneGC sets gcPercent unless the user tuned the collector themselves.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetGCPercent(gcPercent)
}
