package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/platform"
)

// setupSandbox sets up the calls' sandbox as cfg asks and returns it (nil
// for none, runner.Config.Sandbox) and the state to show; false ends the
// start: --sandbox on where none can be
// had, or a code policy without one that --sandbox off did not accept in
// so many words (the policy decides what code starts; without a sandbox,
// what it reaches once started is everything the worker can).
func setupSandbox(log *slog.Logger, cfg config.Config, exe string, exeErr error, stateDir string) (*runner.Sandbox, string, bool) {
	if exeErr != nil && cfg.Sandbox != "off" {
		log.Error("cannot sandbox calls: the worker's own binary cannot be found to set each sandbox up", "error", exeErr)
		return nil, "", false
	}
	sb, state, missing := runner.SetupSandbox(cfg.Sandbox, SandboxOf(cfg, exe, stateDir), stateDir)
	off := strings.HasPrefix(state, runner.SandboxOff)
	switch {
	case missing:
		log.Error("--sandbox on, but no sandbox can be had here", "sandbox", state)
		return nil, "", false
	case off && cfg.Policy.On() && cfg.Sandbox != "off":
		log.Error("a code policy is on but calls cannot be sandboxed here: node code would reach everything the worker can; fix what the sandbox line says, or accept it with --sandbox off", "sandbox", state)
		return nil, "", false
	case off && cfg.Sandbox != "off":
		log.Warn("calls run without a sandbox: node code can read the worker's token and state and signal it", "sandbox", state)
	}
	return sb, state, true
}

// SandboxOf is the sandbox every runner of cfg shares: the state
// directory, the config file and the token file hidden (with its
// directory where it is a Kubernetes Secret's, see projected); the
// owner's --sandbox-bind paths shown.
func SandboxOf(cfg config.Config, exe, stateDir string) runner.Sandbox {
	sb := runner.Sandbox{Exe: exe, Hide: []string{stateDir}}
	for _, f := range []string{cfg.File, cfg.TokenFile} {
		if f == "" {
			continue
		}
		if abs, err := filepath.Abs(f); err == nil {
			sb.Hide = append(sb.Hide, abs)
			if projected(abs) {
				sb.Hide = append(sb.Hide, filepath.Dir(abs))
			}
		}
	}
	for _, b := range cfg.SandboxBinds {
		p, mode, _ := strings.Cut(b, ":")
		sb.Binds = append(sb.Binds, platform.SandboxBind{Path: p, Write: mode == "rw"})
	}
	return sb
}

// projected reports whether path is a file of a Kubernetes Secret,
// ConfigMap or projected volume: a link through the volume's "..data"
// link to a timestamped directory, which the kubelet replaces when the
// Secret changes. Hiding the file hides the file of the moment (a mount
// follows the links); a runner sandboxed before a rotation, or forked
// from a zygote that was, would see the next token. Its directory, the
// volume, holds nothing else a call needs and is hidden whole.
func projected(path string) bool {
	target, err := os.Readlink(path)
	return err == nil && strings.HasPrefix(target, "..data"+string(filepath.Separator))
}
