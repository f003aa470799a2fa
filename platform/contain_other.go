//go:build !linux

package platform

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// On macOS a call's process group is what there is: no subreaper, and no
// other process's environment to read. A process that leaves the group
// (setsid, a double fork) outlives its call.

// SetupContainment says that calls are contained by their process group.
func SetupContainment() (string, error) { return ContainProcessGroup, nil }

// StartContained starts cmd.
func StartContained(cmd *exec.Cmd) error { return cmd.Start() }

// Forget does nothing here.
func Forget(pid int) {}

// FindCookie finds nothing here: another process's environment cannot be read.
func FindCookie(name, value string, skipGroup int) []int { return nil }

// ProcessAlive reports whether pid exists (a zombie counts as alive here).
func ProcessAlive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// Adopt fails here: nothing is re-parented to this process.
func Adopt(start func() (int, error)) (int, error) {
	return 0, errors.New("adopting processes needs Linux's child subreaper")
}

// IsSubreaper is false here.
func IsSubreaper() bool { return false }

// ReapOrphans does nothing here: nothing is adopted.
func ReapOrphans() int { return 0 }

// RaiseOOMScore does nothing here: macOS has no oom_score_adj.
func RaiseOOMScore(pid, adj int) error { return nil }

// MaxRSSBytes converts rusage's maxrss, which macOS gives in bytes.
func MaxRSSBytes(maxrss int64) int64 { return maxrss }

// CallCgroups and CallCgroup are Linux's; SetupCgroups always fails here,
// so none of their methods is ever called.
type (
	CallCgroups struct{}
	CallCgroup  struct{}
)

// CloneInto is never asked here.
func (cc *CallCgroups) CloneInto() bool { return false }

// LeftAlone is never asked here.
func (cc *CallCgroups) LeftAlone() []string { return nil }

// ProbeCgroups fails: there are no cgroups here.
func ProbeCgroups() error { return errors.New("cgroups are Linux's") }

// SetupCgroups fails: there are no cgroups here.
func SetupCgroups() (*CallCgroups, error) { return nil, errors.New("cgroups are Linux's") }

func (cc *CallCgroups) New(name string) (*CallCgroup, error) {
	return nil, errors.New("cgroups are Linux's")
}
func (cc *CallCgroups) NewFor(role CgroupRole, name string) (*CallCgroup, error) {
	return nil, errors.New("cgroups are Linux's")
}
func (g *CallCgroup) Dir() string                              { return "" }
func (g *CallCgroup) Role() CgroupRole                         { return CgroupCall }
func (g *CallCgroup) Prepare(cmd *exec.Cmd)                    {}
func (g *CallCgroup) Started(pid int) error                    { return nil }
func (g *CallCgroup) Move(pid int) error                       { return nil }
func (g *CallCgroup) Signal(sig syscall.Signal, skip int) bool { return false }
func (g *CallCgroup) Populated() bool                          { return false }
func (g *CallCgroup) WaitEmpty(wait time.Duration) bool        { return true }
func (g *CallCgroup) Kill()                                    {}
func (g *CallCgroup) Remove(wait time.Duration) error          { return nil }
func (g *CallCgroup) PeakMemory() int64                        { return 0 }
func (g *CallCgroup) CPU() time.Duration                       { return 0 }
func (g *CallCgroup) Reusable() bool                           { return false }
func (g *CallCgroup) Unfit() string                            { return "cgroups are Linux's" }
func (g *CallCgroup) Unusable() string                         { return "" }
func (g *CallCgroup) Frozen() bool                             { return false }
func (g *CallCgroup) Thaw() error                              { return nil }
func (g *CallCgroup) Reuse() *CallCgroup                       { return g }

// OOMWatch finds nothing: there is no memory cgroup to read here.
type OOMWatch struct{}

// WatchOOM watches nothing.
func WatchOOM(g *CallCgroup) *OOMWatch { return &OOMWatch{} }

// Killed reports false: nothing says the OOM killer killed.
func (w *OOMWatch) Killed() bool { return false }

// ExitWatch follows nothing here: no process is ever adopted.
type ExitWatch struct{}

// WatchExit follows nothing.
func WatchExit(pid int) *ExitWatch { return &ExitWatch{} }

// Exited never closes.
func (w *ExitWatch) Exited() <-chan struct{} { return nil }

// HasExited says nothing exited.
func (w *ExitWatch) HasExited() bool { return false }

// WaitAdopted fails: nothing is re-parented to this process.
func (w *ExitWatch) WaitAdopted() (syscall.WaitStatus, *syscall.Rusage, error) {
	return 0, nil, errors.New("adopting processes needs Linux's child subreaper")
}

// Close does nothing.
func (w *ExitWatch) Close() {}
