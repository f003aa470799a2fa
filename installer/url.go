package installer

import "github.com/fluksio/fluksio-worker/agent/config"

// completeURL is config.CompleteURL: install completes a URL exactly as run
// and check do.
func completeURL(raw string) (endpoint, warning string, err error) {
	return config.CompleteURL(raw)
}
