package installer

import (
	"context"
	"io"
)

// RestartCommand is `fluksio-worker restart`: stop and start the service,
// so it reads its config again.
func RestartCommand(_ context.Context, args []string, stdout, stderr io.Writer) int {
	return control(thisHost(), "restart", args, stdout, stderr, writeRestartUsage, (*manager).Restart, "Restarted")
}

var writeRestartUsage = writeControlUsage("restart", `Restarts the installed worker service, so it reads its config again: calls it
is running are cancelled (and reported), then it reconnects to the engine.
A stopped service is started.`)
