//go:build !linux

package platform

import "errors"

// SetLimits fails: there are no cgroups here (SetupCgroups never returns
// any CallCgroups, so it is not called).
func (cc *CallCgroups) SetLimits(l CallLimits) error {
	return errors.New("per-call limits need Linux's cgroups")
}

// CallLimit is 0: no call has a limit here.
func (w *OOMWatch) CallLimit() int64 { return 0 }

// ErrNoController: no limit can be had here.
var ErrNoController = errors.New("the controller cannot be had here")

// Limited is false: no call has limits here.
func (cc *CallCgroups) Limited() bool { return false }

// MemoryLimited is false: no call has limits here.
func (cc *CallCgroups) MemoryLimited() bool { return false }
