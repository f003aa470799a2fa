//go:build !linux

package runner

// Without change notifications, every path a warm runner's code came from
// is followed by status (fresh.go).

type changeWatcher struct{}

var systemChanges = func() *changeWatcher { return nil }

func (w *changeWatcher) add(cw *codeWatch, paths []reportedPath) []reportedPath { return paths }
func (w *changeWatcher) hold(cw *codeWatch) bool                                { return true }
func (w *changeWatcher) release(cw *codeWatch)                                  {}
func (w *changeWatcher) sync() bool                                             { return false }

type interest struct{}
