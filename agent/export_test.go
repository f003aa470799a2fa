package agent

import "time"

// SetResumeWait shortens a's wait for the engine's resume answer; it is
// called before a serves.
func (a *Agent) SetResumeWait(d time.Duration) { a.resumeWait = d }
