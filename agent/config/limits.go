package config

import "github.com/fluksio/fluksio-worker/platform"

// CallLimits are the per-call limits set on each call's cgroup.
func (c Config) CallLimits() platform.CallLimits {
	return platform.CallLimits{MemoryMax: c.CallMemoryMax, PidsMax: c.CallPidsMax, CPUMax: c.CallCPUMax}
}
