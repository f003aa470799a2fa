package agent

import (
	"log/slog"

	"github.com/fluksio/fluksio-worker/agent/runner"
)

// SetupContainment prepares this process to contain calls as --containment
// asks and returns the mode in use (see runner.SetupContainment).
func SetupContainment(log *slog.Logger, want string) string {
	return runner.SetupContainment(log, want)
}

// ProbeContainment says which mode `run` would use here, for inventory
// and check (see runner.ProbeContainment).
func ProbeContainment(want string) string { return runner.ProbeContainment(want) }
