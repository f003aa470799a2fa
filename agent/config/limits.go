package config

import (
	"strconv"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/platform"
)

// CallLimits are the per-call limits set on each call's cgroup.
func (c Config) CallLimits() platform.CallLimits {
	return platform.CallLimits{MemoryMax: c.CallMemoryMax, PidsMax: c.CallPidsMax, CPUMax: c.CallCPUMax}
}

// LimitsText is the limits in force, in one line, for status and the
// start's log: what each call may use, and the free disk below which new
// calls are declined.
func (c Config) LimitsText() string {
	var per []string
	if c.CallMemoryMax > 0 {
		per = append(per, "memory "+logging.FormatBytes(c.CallMemoryMax))
	}
	if c.CallPidsMax > 0 {
		per = append(per, strconv.Itoa(c.CallPidsMax)+" processes")
	}
	if c.CallCPUMax > 0 {
		cpus := strconv.FormatFloat(c.CallCPUMax, 'f', -1, 64)
		if c.CallCPUMax == 1 {
			per = append(per, cpus+" CPU")
		} else {
			per = append(per, cpus+" CPUs")
		}
	}
	text := "none per call"
	if len(per) > 0 {
		text = strings.Join(per, ", ") + " per call"
	}
	if c.MinFreeDisk > 0 {
		text += "; new calls declined below " + logging.FormatBytes(c.MinFreeDisk) + " free disk"
	}
	return text
}
