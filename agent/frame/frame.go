// Package frame owns the memory of the messages the worker moves: the pool
// the small frames of a call's events are recycled through, the size from
// which a message is outsized, and giving an outsized message's memory back
// to the system. The runner fills frames, the socket's writer gives them
// back once written, and whoever drops an outsized message releases its
// memory; none of them needs the others for it.
//
// It imports nothing of the project, so every package may use it.
package frame

import (
	"runtime/debug"
	"sync"
)

// Frames are recycled: a chatty node sends tens of thousands of events a
// second, and a fresh buffer for each would be most of what the worker
// allocates (and so of its resident memory, through the collector's
// headroom). A frame handed to the socket is owned by its writer, which
// puts it back with Put once written.
//
// The pool holds *[]byte, and the boxes themselves are recycled through
// boxes: putting a frame back into the pool costs no allocation, so
// relaying an event allocates nothing here (a new box for each put would
// be 24 bytes an event, a collection every ~170,000 events).
var (
	pool  = sync.Pool{New: func() any { return new([]byte) }}
	boxes = sync.Pool{New: func() any { return new([]byte) }}
)

// MaxPooled is the largest frame the pool keeps: answers of many MiB stay
// out of it.
const MaxPooled = 16 << 10

// Get returns an empty frame to append at most n bytes to: one from the
// pool, or a new one of capacity n if n is over MaxPooled.
func Get(n int) []byte {
	if n > MaxPooled {
		return make([]byte, 0, n)
	}
	box := pool.Get().(*[]byte)
	frame := (*box)[:0]
	*box = nil
	boxes.Put(box)
	return frame
}

// Put gives back a frame once it is written; the caller must not use it
// again. Frames over MaxPooled are left to the collector.
func Put(frame []byte) {
	if cap(frame) == 0 || cap(frame) > MaxPooled {
		return
	}
	box := boxes.Get().(*[]byte)
	*box = frame
	pool.Put(box)
}

// Outsized is the size from which a message (a frame from the engine, a
// call's request or answer) is outsized: after one, the memory it took is
// given back to the system at once (Release). Go's collector would
// otherwise keep it, because an idle worker allocates too little to run a
// collection for minutes, and the service would sit at hundreds of MiB
// after one large answer.
const Outsized = 8 << 20

// Release collects and returns free memory to the system; call it once an
// outsized message is dropped. It costs a full collection, a few
// milliseconds at this worker's heap size, which is nothing next to moving
// an outsized message.
func Release() { debug.FreeOSMemory() }
