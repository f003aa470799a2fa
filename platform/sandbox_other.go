//go:build !linux

package platform

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// SandboxCommand: there is no sandbox but on Linux.
func SandboxCommand(*exec.Cmd, string, SandboxSpec) error {
	return errors.New("a sandbox needs Linux")
}

// ProbeSandbox says why there is no sandbox here.
func ProbeSandbox(string, string) (why, note string) {
	return "this system has no user and mount namespaces (a sandbox needs Linux 5.12 or later)", ""
}

// SandboxExec is never run but on Linux.
func SandboxExec() {
	fmt.Fprintln(os.Stderr, "fluksio-worker sandbox: a sandbox needs Linux")
	os.Exit(SandboxExitSetup)
}

// SandboxScopes: no sandbox, no scopes.
func SandboxScopes() bool { return false }
