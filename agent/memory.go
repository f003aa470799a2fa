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
