package agent

import "runtime/debug"

// outsizedMessage is the size from which a message (a frame from the
// engine, a call's request or answer) is outsized: after one, the memory
// it took is given back to the system at once. Go's collector would
// otherwise keep it, because an idle worker allocates too little to run a
// collection for minutes, and the service would sit at hundreds of MiB
// after one large answer.
const outsizedMessage = 8 << 20

// freeMemory collects and returns free memory to the system. It costs a
// full collection, a few milliseconds at this worker's heap size, which is
// nothing next to moving an outsized message.
func freeMemory() { debug.FreeOSMemory() }

// gcPercent is the collector's GOGC for `run`, unless the environment sets
// GOGC or GOMEMLIMIT: the heap may grow by half its live size between
// collections instead of all of it. The worker's live heap is small (well
// under 1 MiB between calls), so the default of 100 let a burst of events,
// each a few small allocations, grow it to the collector's 4 MiB minimum
// before every collection, a large part of the worker's peak resident
// memory; at 50 the minimum is 2 MiB, for a few more collections of a
// fraction of a millisecond each. An outsized message, being one
// pointer-free buffer, costs a collection next to nothing to mark, and its
// memory is given back at once anyway (freeMemory).
const gcPercent = 50

// tuneGC sets gcPercent unless the user tuned the collector themselves.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetGCPercent(gcPercent)
}
