package installer

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/platform"
)

// checkLimits is check's limits item: the per-call limits need a cgroup
// per call (whether each controller can be had is learnt when the worker
// starts, which refuses to start without it).
func checkLimits(c *checklist, cfg config.Config, mode string) {
	l := cfg.CallLimits()
	if !l.Any() {
		c.skip("limits", "none (--call-memory-max, --call-pids-max, --call-cpu-max)")
		return
	}
	var set []string
	if l.MemoryMax > 0 {
		set = append(set, "memory "+logging.FormatBytes(l.MemoryMax))
	}
	if l.PidsMax > 0 {
		set = append(set, "pids "+strconv.Itoa(l.PidsMax))
	}
	if l.CPUMax > 0 {
		set = append(set, "cpu "+strconv.FormatFloat(l.CPUMax, 'f', -1, 64))
	}
	if mode != platform.ContainCgroup {
		c.fail("limits", fmt.Errorf("%s per call need a cgroup per call, and calls here are contained by %s: run the worker as root or in a systemd unit with Delegate=yes (as 'fluksio-worker install' writes), or leave the limits out; the worker refuses to start as it is", strings.Join(set, ", "), mode))
		return
	}
	c.ok("limits", "%s per call, on each call's cgroup", strings.Join(set, ", "))
}

// checkDisk is check's disk item: the free space where calls write
// against --min-free-disk.
func checkDisk(c *checklist, cfg config.Config, getenv func(string) string) {
	dir, err := config.ResolveStateDir(cfg, getenv)
	if err != nil {
		c.skip("disk", "no state directory to look at: "+err.Error())
		return
	}
	// Not made yet: the file system it will be made on.
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			break
		}
		dir = filepath.Dir(dir)
	}
	free, err := platform.FreeBytes(dir)
	switch {
	case err != nil:
		c.skip("disk", "cannot tell the free space in "+dir+": "+err.Error())
	case free < cfg.MinFreeDisk:
		c.fail("disk", fmt.Errorf("%s free in %s, less than --min-free-disk %s: the worker would decline every call; free space there, give --state-dir on a larger disk, or lower --min-free-disk", logging.HumanBytes(free), dir, logging.FormatBytes(cfg.MinFreeDisk)))
	default:
		c.ok("disk", "%s free in %s (calls are declined below --min-free-disk %s)", logging.HumanBytes(free), dir, logging.FormatBytes(cfg.MinFreeDisk))
	}
}
