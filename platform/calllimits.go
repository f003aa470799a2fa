package platform

// CallLimits are the machine owner's limits on each call's processes
// (--call-memory-max, --call-pids-max, --call-cpu-max), set on the call's
// cgroup: the kernel then holds the call to them, not the worker. Zero is
// no limit.
type CallLimits struct {
	MemoryMax int64   // bytes: memory.max (v2), memory.limit_in_bytes (v1)
	PidsMax   int     // processes and threads: pids.max
	CPUMax    float64 // CPUs: cpu.max (v2), cpu.cfs_quota_us (v1)
}

// Any reports whether any limit is set.
func (l CallLimits) Any() bool { return l.MemoryMax > 0 || l.PidsMax > 0 || l.CPUMax > 0 }

// cpuPeriodUS is the period of a CPU quota, in microseconds: the kernel's
// default (100 ms).
const cpuPeriodUS = 100000
