// Stubs for the commands not built yet; each moves to its own file.

package installer

import (
	"context"
	"fmt"
	"io"
)

func notYet(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "fluksio-worker: not built yet")
	return 2
}

var (
	InstallCommand   = notYet
	UninstallCommand = notYet
	StartCommand     = notYet
	StopCommand      = notYet
	RestartCommand   = notYet
	StatusCommand    = notYet
	CheckCommand     = notYet
)
