package platform

// The sandbox around a call's runner: what node code may see, write and
// signal. The worker starts a runner through itself (SandboxCommand): the
// process is made in new user, mount and PID namespaces, and the worker's
// own binary, run as the hidden command SandboxExecArg (sandbox_linux.go),
// lays out the mounts, drops every capability and executes the
// interpreter. What it lays out is the SandboxSpec:
//
//   - the whole file system read-only, but for the call's own directory,
//     a private /tmp, /var/tmp and /dev/shm (memory there is the call's:
//     the kernel charges tmpfs pages to the cgroup of whoever wrote them,
//     and the mounts go with the namespace when the call's last process
//     ends), and the paths the machine's owner made writable
//     (--sandbox-bind PATH:rw);
//   - the worker's state directory, config and token hidden under empty
//     read-only mounts, with only the call's own directory and the files
//     the runner executes shown inside (those read-only);
//   - a /dev of its own with the usual character devices and the GPUs'
//     (/dev/nvidia*, /dev/dri, /dev/kfd), and no disks;
//   - Landlock's scopes (Linux 6.12): it cannot signal, trace (read the
//     memory or environment of) or reach the abstract sockets of any
//     process outside it: the worker, its zygotes and spares, other
//     calls. Where the kernel is older, a PID namespace of its own (and
//     its own /proc) instead: what is outside cannot be named.
//
// Node code runs as the worker's uid with no capability (in any
// namespace) and no_new_privs: it cannot undo a mount, and since /sys is
// read-only it cannot write its cgroup's limits or move itself out.

// SandboxExecArg is the hidden command the worker runs itself as, to set a
// runner's sandbox up; it is never typed by a person.
const SandboxExecArg = "__fluksio-sandbox-exec"

// SandboxSpecEnv carries the spec (JSON) from the worker to its helper,
// which removes it from the runner's environment.
const SandboxSpecEnv = "FLUKSIO_SANDBOX_SPEC"

// SandboxSpec is one runner's sandbox.
type SandboxSpec struct {
	// Hide are directories and files made empty and read-only.
	Hide []string `json:"hide"`
	// Binds are shown at their own path, inside a hidden directory or
	// not: read-only, or writable where Write (the call's directory, the
	// owner's writable paths).
	Binds []SandboxBind `json:"binds"`
	// Dir is the runner's working directory.
	Dir string `json:"dir"`
	// Probe: set up, then exit 0 without executing anything (what the
	// worker tries at start).
	Probe bool `json:"probe,omitempty"`
	// OwnPIDs: a PID namespace of its own, with its own /proc, so that
	// nothing outside can be named, so signalled. Without it the process
	// keeps the worker's pids (what node code and the worker's tests see
	// of a process is its real pid), and Landlock's scopes keep it from
	// signalling or tracing anything outside it (Linux 6.12,
	// SandboxScopes), which the helper then requires.
	OwnPIDs bool `json:"own_pids,omitempty"`
	// Zygote: the process forks runners that sandbox themselves
	// (worker_main.py's sandbox_fork), each scoped by Landlock; it is not
	// scoped itself.
	Zygote bool `json:"zygote,omitempty"`
}

// SandboxBind is a path shown in the sandbox.
type SandboxBind struct {
	Path  string `json:"path"`
	Write bool   `json:"write,omitempty"`
}

// SandboxExitSetup is the helper's exit status when the sandbox could not
// be set up (as env and podman use 125 for their own failures): nothing of
// the runner ran.
const SandboxExitSetup = 125
