package runner

import (
	"errors"

	"github.com/fluksio/fluksio-worker/platform"
)

// SetCallLimits holds every call from now on to the machine owner's
// limits (--call-memory-max, --call-pids-max, --call-cpu-max), set on the
// call's cgroup. It fails, saying what to do, where a limit cannot be had:
// no cgroup per call (SetupContainment found none), or a controller the
// calls' cgroups cannot get. mode is the containment SetupContainment
// returned. A limit asked for is never silently ignored.
func SetCallLimits(mode string, l platform.CallLimits) error {
	if !l.Any() {
		return nil
	}
	cgroups := callCgroupsSet()
	if mode != platform.ContainCgroup || cgroups == nil {
		return errors.New("--call-memory-max, --call-pids-max and --call-cpu-max are set on each call's cgroup, and this worker cannot make cgroups here (--containment subreaper, or no writable cgroup v2): run it as root or in a systemd unit with Delegate=yes (as 'fluksio-worker install' writes), or leave the limits out")
	}
	return cgroups.SetLimits(l)
}

// errNoLimitedCgroup: a runner whose call's cgroup could not be made (the
// log says why) is not started where calls have limits: it would run
// without them.
var errNoLimitedCgroup = errors.New("the call's cgroup, which holds it to the per-call limits (--call-memory-max, --call-pids-max, --call-cpu-max), could not be made (the worker's log says why); the call is not run without them")
