//go:build unix

package platform

import (
	"errors"
	"os/exec"
	"syscall"
)

// NewProcessGroup makes cmd the leader of a new process group, so that
// everything a call starts (data loader workers, shells, compilers) can be
// stopped together.
func NewProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// SignalGroup sends sig to the process group led by pid. It reports false
// when the group no longer exists.
func SignalGroup(pid int, sig syscall.Signal) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(-pid, sig)
	return !errors.Is(err, syscall.ESRCH)
}

// GroupAlive reports whether any process of the group led by pid remains.
func GroupAlive(pid int) bool {
	return SignalGroup(pid, 0)
}
