package runner

// The sandbox each runner starts in (platform/sandbox.go says what it
// lays out): the runner package decides what a runner is shown, which is
// its own call directory (writable), the files its interpreter executes
// (read-only), the machine owner's paths (--sandbox-bind) and, for a
// worker started by hand in a project directory that its runners work in,
// that directory; and what is hidden: the state directory, the config and
// the token.
//
// A zygote is started in a sandbox too, which keeps the worker's PID
// namespace (the pids it reports are the worker's to watch) and shows the
// call directories' directory: each runner it forks makes a sandbox of its
// own before its call arrives (worker_main.py's sandbox_fork: namespaces
// of its own, the other calls' directories hidden, Landlock's scopes for
// signals). Where Landlock's scopes are missing (Linux before 6.12), no
// zygote is used: spares are started, each in a sandbox of its own.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/artifacts"
	"github.com/fluksio/fluksio-worker/platform"
)

// Sandbox is what every runner's sandbox shares.
type Sandbox struct {
	Exe   string                 // the worker's binary, which sets each sandbox up
	Hide  []string               // the state directory, the config file, the token file
	Binds []platform.SandboxBind // the machine owner's (--sandbox-bind)
	// forks: Landlock's scopes are there (platform.SandboxScopes): runners
	// keep their pids, and those forked from a zygote can sandbox
	// themselves. Without, each runner has a PID namespace of its own.
	forks bool
}

// SandboxOff is the start of the state said for a worker without one.
const SandboxOff = "off"

// SetupSandbox is the runners' sandbox as --sandbox asks: "off" never,
// "on" or "auto" where the kernel gives one; nil for none. The caller
// hands it to its pool (Config.Sandbox): each worker's own, never the
// process's, so that workers in one process (tests, selftest) keep theirs.
// It returns the state to say at start, in check and in status ("on", or
// "off: WHY, what to change"), and whether the sandbox wanted ("on")
// could not be had.
func SetupSandbox(want string, sb Sandbox, stateDir string) (set *Sandbox, state string, missing bool) {
	if want == "off" {
		return nil, SandboxOff + ": --sandbox off", false
	}
	state = ProbeSandbox(want, sb.Exe, stateDir)
	if strings.HasPrefix(state, SandboxOff) {
		return nil, state, want == "on"
	}
	sb.forks = platform.SandboxScopes()
	return &sb, state, false
}

// sandboxAdvice is what to change, for a reason the probe gave.
func sandboxAdvice(why string) string {
	switch {
	case strings.Contains(why, "Linux"):
		return ""
	case strings.Contains(why, "namespace"), strings.Contains(why, "operation not permitted"):
		return "; allow user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1; in a systemd unit RestrictNamespaces=user mnt pid and @mount allowed in SystemCallFilter), or say --sandbox off"
	}
	return "; or say --sandbox off"
}

// ProbeSandbox says what SetupSandbox would, for check.
func ProbeSandbox(want, exe, stateDir string) string {
	if want == "off" {
		return SandboxOff + ": --sandbox off"
	}
	why, note := platform.ProbeSandbox(exe, stateDir)
	switch {
	case why != "":
		return SandboxOff + ": " + why + sandboxAdvice(why)
	case note != "":
		return "on, " + note
	}
	return "on"
}

// sandboxed makes cmd, a runner with its call directory dir and the script
// its interpreter runs, start in its sandbox, where there is one.
func (c *Config) sandboxed(cmd *exec.Cmd, dir *callDir, zygote bool, scripts ...string) error {
	sb := c.Sandbox
	if sb == nil {
		return nil
	}
	spec := platform.SandboxSpec{Hide: sb.Hide, Dir: cmd.Dir, Zygote: zygote, OwnPIDs: !sb.forks}
	spec.Binds = append(spec.Binds, platform.SandboxBind{Path: dir.path, Write: true})
	owner := c.ownerShown(sb)
	if zygote {
		// Its forks' directories, each of which hides the others.
		calls := filepath.Dir(dir.path)
		spec.Binds = append(spec.Binds, platform.SandboxBind{Path: calls, Write: true})
		shown := []string{calls}
		for _, b := range owner {
			shown = append(shown, b.Path)
		}
		js, _ := json.Marshal(shown)
		cmd.Env = append(cmd.Env, sandboxForksEnv+"="+string(js))
	}
	for _, s := range scripts {
		if s != "" && !slices.ContainsFunc(spec.Binds, func(b platform.SandboxBind) bool { return b.Path == s }) {
			spec.Binds = append(spec.Binds, platform.SandboxBind{Path: s})
		}
	}
	spec.Binds = append(spec.Binds, owner...)
	if dir.cwd == "" {
		// The worker's own working directory, where its runners work (a
		// person's project directory).
		if wd, err := os.Getwd(); err == nil {
			spec.Binds = append(spec.Binds, platform.SandboxBind{Path: wd, Write: true})
			spec.Dir = wd
		}
	}
	cmd.Env = c.sandboxEnv(cmd.Env, dir, sb)
	if err := platform.SandboxCommand(cmd, sb.Exe, spec); err != nil {
		return fmt.Errorf("the runner's sandbox: %w", err)
	}
	return nil
}

// sandboxReplaced are the directories every sandbox replaces with empty
// ones of its own (platform's layOut).
var sandboxReplaced = []string{"/tmp", "/var/tmp", "/dev/shm"}

// interpreterBind shows the interpreter read-only where the sandbox would
// replace or hide it (a virtual environment made under /tmp): its
// environment (the directory above its bin/) or, where that is a
// directory every sandbox replaces, the directory it is in.
func interpreterBind(python string, hidden []string) (platform.SandboxBind, bool) {
	if !within(python, sandboxReplaced) && !within(python, hidden) {
		return platform.SandboxBind{}, false
	}
	dir := filepath.Dir(python)
	if filepath.Base(dir) == "bin" {
		dir = filepath.Dir(dir)
	}
	if slices.Contains(sandboxReplaced, dir) || slices.Contains(hidden, dir) {
		dir = python
	}
	return platform.SandboxBind{Path: dir}, true
}

// ownerShown is what every runner of c is shown besides its call
// directory: the interpreter where its sandbox would cover it
// (interpreterBind), the directories of the worker's own PYTHONPATH under
// the paths each sandbox replaces (a person's checkout in /tmp, read-only;
// never the engine's PYTHONPATH of a request, which could name another
// user's files there), the worker's artifact cache's entries, read-only
// and not to be listed (sharedArtifacts), and the owner's --sandbox-bind
// paths, last.
func (c *Config) ownerShown(sb *Sandbox) []platform.SandboxBind {
	var shown []platform.SandboxBind
	if b, ok := interpreterBind(c.Python, sb.Hide); ok {
		shown = append(shown, b)
	}
	if path, ok := lookupEnv(c.BaseEnv, "PYTHONPATH"); ok {
		for _, p := range filepath.SplitList(path) {
			if !filepath.IsAbs(p) || !within(p, sandboxReplaced) || slices.Contains(sandboxReplaced, filepath.Clean(p)) || within(p, sb.Hide) {
				continue
			}
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				shown = append(shown, platform.SandboxBind{Path: filepath.Clean(p)})
			}
		}
	}
	if shared := c.sharedArtifacts(sb); shared != "" {
		shown = append(shown, platform.SandboxBind{Path: artifacts.ShownDir(shared)})
	}
	return append(shown, sb.Binds...)
}

// sandboxEnv points what the environment names that node code could not
// use in its sandbox at the call's own directory: the artifact cache
// (hidden with the state directory or read-only: each call caches what it
// fetches for itself, unless the owner made a cache writable with
// --sandbox-bind, since a cache calls write is one a node could poison for
// the next) and HOME where it is hidden (a service's is its state
// directory). The worker's own cache is shown read-only instead
// (FLUKSIO_ARTIFACT_SHARED, sharedArtifacts): what a call fetched, the
// worker takes in once the call is gone (Config.AdoptArtifacts).
func (c *Config) sandboxEnv(env []string, dir *callDir, sb *Sandbox) []string {
	env = slices.Clip(env)
	set := func(name, v string) {
		// In place: an interpreter takes the first of two entries.
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") })
		env = append(env, name+"="+v)
	}
	if v, ok := lookupEnv(env, ArtifactCacheEnv); ok && !within(v, writableBinds(sb.Binds)) {
		set(ArtifactCacheEnv, ownArtifacts(dir))
		if shared := c.sharedArtifacts(sb); shared != "" && v == shared {
			set(ArtifactSharedEnv, shared)
		}
	}
	if v, ok := lookupEnv(env, "HOME"); ok && within(v, sb.Hide) {
		set("HOME", dir.path)
	}
	return env
}

// ownArtifacts is the artifact cache of a sandboxed call: in its own call
// directory, removed with it.
func ownArtifacts(dir *callDir) string { return filepath.Join(dir.path, ".fluksio-artifacts") }

// sharedArtifacts is the worker's own artifact cache (the worker's
// FLUKSIO_ARTIFACT_CACHE, never one a request names), where its sandboxed
// calls cache for themselves: the directory of its entries they may load
// but not list (artifacts.Adopt) is shown to them read-only; "" where the
// calls write the cache themselves (a --sandbox-bind made it writable) or
// there is none. That directory is made here, so that there is one to
// show.
func (c *Config) sharedArtifacts(sb *Sandbox) string {
	v, ok := lookupEnv(c.BaseEnv, ArtifactCacheEnv)
	if !ok || !filepath.IsAbs(v) || within(v, writableBinds(sb.Binds)) {
		return ""
	}
	if os.MkdirAll(v, 0o700) != nil || artifacts.MakeShownDir(v) != nil {
		return ""
	}
	return v
}

// writableBinds are the paths of the owner's binds that calls may write.
func writableBinds(binds []platform.SandboxBind) []string {
	var writable []string
	for _, b := range binds {
		if b.Write {
			writable = append(writable, b.Path)
		}
	}
	return writable
}

// lookupEnv is the last value of name in env.
func lookupEnv(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// within reports whether path is one of dirs or below one.
func within(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}
