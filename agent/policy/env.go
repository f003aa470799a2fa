package policy

import (
	"sort"
	"strings"
)

// Side doors: environment variables with which a call's env could make
// the node's interpreter, or a program the node starts, load code that no
// rule of the policy saw. With a code policy on, a call whose env sets one
// is refused (not run with the variable dropped: a node that needs it
// would fail later, and less clearly).
var (
	// sideDoorPrefixes: the dynamic loader's (LD_PRELOAD, LD_AUDIT,
	// LD_LIBRARY_PATH; DYLD_ on macOS) and Python's own, every one of
	// which but those in harmlessPython changes what is imported or run
	// (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONBREAKPOINT names a
	// callable to import, PYTHONWARNINGS imports warning categories).
	sideDoorPrefixes = []string{"LD_", "DYLD_", "PYTHON"}
	// sideDoorNames: startup files and module paths of the shells and
	// interpreters a node commonly starts, the C library's conversion
	// modules, CUDA's injection library, git's helpers, and a library's
	// plugin named by module (MPLBACKEND=module://pkg imports pkg).
	sideDoorNames = map[string]bool{
		"BASH_ENV": true, "ENV": true, "SHELLOPTS": true, "BASHOPTS": true, "PS4": true,
		"GCONV_PATH": true, "CUDA_INJECTION64_PATH": true,
		"PERL5LIB": true, "PERLLIB": true, "PERL5OPT": true, "RUBYLIB": true, "RUBYOPT": true,
		"NODE_OPTIONS": true, "NODE_PATH": true, "JAVA_TOOL_OPTIONS": true, "_JAVA_OPTIONS": true, "JDK_JAVA_OPTIONS": true,
		"GIT_EXEC_PATH": true, "GIT_SSH_COMMAND": true, "GIT_SSH": true, "GIT_ASKPASS": true, "GIT_CONFIG_GLOBAL": true,
		"HOME": true, "XDG_CONFIG_HOME": true, "MPLBACKEND": true,
	}
	// harmlessPython are PYTHON* variables that change how output is
	// written or hashed, never what runs.
	harmlessPython = map[string]bool{
		"PYTHONUNBUFFERED": true, "PYTHONHASHSEED": true, "PYTHONIOENCODING": true, "PYTHONUTF8": true,
		"PYTHONDONTWRITEBYTECODE": true, "PYTHONFAULTHANDLER": true,
	}
)

// CheckEnv refuses a call whose env (KEY=VALUE entries) sets a side door,
// with a policy on. workerPATH is the worker's own PATH: a call may repeat
// it, not change it.
func (p *Policy) CheckEnv(env []string, workerPATH string) *Refusal {
	if !p.On() {
		return nil
	}
	var doors []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" && v == workerPATH {
			continue
		}
		if sideDoor(k) {
			doors = append(doors, k)
		}
	}
	if len(doors) == 0 {
		return nil
	}
	sort.Strings(doors)
	return &Refusal{Rule: "a code policy is on", Reason: "the call's env sets " + cut(strings.Join(doors, ", "), 300) +
		", with which it could load code the policy did not check",
		Change: "Leave these out of the node's env; the machine's owner can set what the worker's calls need in the worker's own environment (its service unit)."}
}

func sideDoor(key string) bool {
	k := strings.ToUpper(key)
	if k == "PATH" || sideDoorNames[k] {
		return true
	}
	for _, p := range sideDoorPrefixes {
		if strings.HasPrefix(k, p) {
			return !harmlessPython[k]
		}
	}
	return false
}

// EnvKeys are the env entries' names, sorted, for a hook.
func EnvKeys(env []string) []string {
	keys := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
