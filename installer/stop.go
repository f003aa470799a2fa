package installer

import (
	"context"
	"io"
)

// StopCommand is `fluksio-worker stop`: stop the installed service.
func StopCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	return control(thisHost(), "stop", args, stdout, stderr, writeStopUsage, (*manager).Stop, "Stopped")
}

var writeStopUsage = writeControlUsage("stop", `Stops the installed worker service. Calls it is running are cancelled and
reported to the engine as such (the engine may run them elsewhere), then it
disconnects. It stays installed and starts again at the next boot, or with
'fluksio-worker start'.`)
