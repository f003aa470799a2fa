package agent

// --min-free-disk: a call that finds the disk full half-way (a checkpoint,
// an artifact, its held output) fails after it used its GPU for nothing;
// declined before it starts, it runs on another worker.

import (
	"fmt"
	"path/filepath"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/platform"
)

// msgLowDisk opens the answer to a call declined for want of disk; like a
// drain's, it is NodeCancelled, so the engine runs the call elsewhere.
const msgLowDisk = "declined by this worker: too little free disk: "

// writtenDirs are where calls write: the state directory, and in it the
// call directories, the artifact cache and the held calls' spill files,
// any of which may be a file system of its own.
func (a *Agent) writtenDirs() []string {
	return []string{a.stateDir, filepath.Join(a.stateDir, "calls"), filepath.Join(a.stateDir, "artifacts"), a.heldDir()}
}

// lowDisk says which place calls write to has less than --min-free-disk
// free, "" when none has (or the check is off). A place not made yet
// holds nothing: the state directory's own file system stands for it.
func (a *Agent) lowDisk() string {
	least := a.cfg.MinFreeDisk
	if least <= 0 {
		return ""
	}
	for _, dir := range a.writtenDirs() {
		free, err := platform.FreeBytes(dir)
		if err == nil && free < least {
			return fmt.Sprintf("%s free in %s, less than --min-free-disk %s", logging.HumanBytes(free), dir, logging.FormatBytes(least))
		}
	}
	return ""
}

// diskRefusal declines a call while lowDisk says the disk is short.
func (a *Agent) diskRefusal() *refusal {
	if why := a.lowDisk(); why != "" {
		return &refusal{metrics.DeclinedDisk, protocol.TypeNodeCancelled, msgLowDisk + why}
	}
	return nil
}
