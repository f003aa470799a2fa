// Package installer writes the worker's config and registers it as an OS
// service (systemd or launchd).
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
