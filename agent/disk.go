package agent

// --min-free-disk: a call that finds the disk full half-way (a checkpoint,
// an artifact, its held output) fails after it used its GPU for nothing;
// declined before it starts, it runs on another worker.
//
// --artifact-cache-max: what the worker keeps for itself, the artifacts
// calls loaded, must never be what takes it out of service. The cache is
// trimmed to its bound after each call, and, while the disk is short,
// further, before a call is declined or /healthz says so.

import (
	"context"
	"fmt"
	"math"
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
	return []string{a.stateDir, filepath.Join(a.stateDir, "calls"), a.artifactDir, a.heldDir()}
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

// shortOfDisk is lowDisk once the artifact cache gave way: what it says
// is short is short of what calls themselves keep.
func (a *Agent) shortOfDisk() string {
	if a.lowDisk() == "" {
		return ""
	}
	a.fitCache()
	return a.lowDisk()
}

// diskRefusal declines a call while the disk is short (shortOfDisk).
func (a *Agent) diskRefusal() *refusal {
	if why := a.shortOfDisk(); why != "" {
		return &refusal{metrics.DeclinedDisk, protocol.TypeNodeCancelled, msgLowDisk + why}
	}
	return nil
}

// cacheLimit is --artifact-cache-max in bytes: a size, or a share of the
// file system the cache is on (of the state directory's, before the cache
// is made; with neither to measure, no bound: the cache is not emptied
// for want of a number).
func (a *Agent) cacheLimit() int64 {
	pct := int64(a.cfg.ArtifactCachePercent)
	if pct == 0 {
		return a.cfg.ArtifactCacheMax
	}
	for _, dir := range []string{a.artifactDir, a.stateDir} {
		if size, err := platform.DiskBytes(dir); err == nil {
			return size / 100 * pct
		}
	}
	return math.MaxInt64
}

// fitCache trims the artifact cache to --artifact-cache-max and, while
// its own file system has less than --min-free-disk free, below it, least
// recently used first; entries a running call loaded stay
// (agent/artifacts). A cache on a file system of its own is not emptied
// for another that is short: that would free nothing there.
func (a *Agent) fitCache() {
	short := func() bool {
		free, err := platform.FreeBytes(a.artifactDir)
		return err == nil && free < a.cfg.MinFreeDisk
	}
	r, err := a.artifacts.Trim(a.cacheLimit(), short)
	if err != nil {
		a.log.Warn("could not trim the artifact cache", "dir", a.artifactDir, "error", err)
	}
	if r.Removed > 0 {
		a.log.Info("removed the artifacts used least recently from the cache",
			"removed", r.Removed, "freed", logging.FormatBytes(r.RemovedBytes),
			"kept", logging.FormatBytes(r.Left), "in_use", r.InUse, "dir", a.artifactDir)
	}
}

// keepCache fits the cache when the worker starts (one restarted on a
// full disk serves again) and after each call (callEnded), until ctx ends.
func (a *Agent) keepCache(ctx context.Context) {
	for {
		a.fitCache()
		select {
		case <-ctx.Done():
			return
		case <-a.cacheUsed:
		}
	}
}

// cacheMayHaveGrown wakes keepCache, which then fits the cache once for
// every call ended since it last did.
func (a *Agent) cacheMayHaveGrown() {
	select {
	case a.cacheUsed <- struct{}{}:
	default:
	}
}
