package platform

// How a worker keeps everything a call starts together, so that all of it
// can be stopped when the call ends.
const (
	// ContainProcessGroup: the runner leads a process group of its own;
	// a process that leaves the group outlives the call.
	ContainProcessGroup = "process-group"
	// ContainSubreaper: the process group, plus a per-call cookie in the
	// environment and the worker as child subreaper (Linux).
	ContainSubreaper = "subreaper+cookie"
	// ContainCgroup: each call in a cgroup v2 of its own (Linux, where the
	// worker may write its cgroup).
	ContainCgroup = "cgroup"
)
