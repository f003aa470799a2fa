package installer

import (
	"context"
	"io"
)

// StartCommand is `fluksio-worker start`: start the installed service.
func StartCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	return control(thisHost(), "start", args, stdout, stderr, writeStartUsage, (*manager).Start, "Started")
}

var writeStartUsage = writeControlUsage("start", `Starts the installed worker service (see 'fluksio-worker install'). It
connects to the engine and takes calls; 'fluksio-worker status' shows when it
has attached. It also starts by itself at boot.`)
