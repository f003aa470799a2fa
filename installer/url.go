package installer

import "github.com/fluksio/fluksio-worker/agent"

// completeURL is agent.CompleteURL: install completes a URL exactly as run
// and check do.
func completeURL(raw string) (endpoint, warning string, err error) {
	return agent.CompleteURL(raw)
}
