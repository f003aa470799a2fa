package installer

import (
	"fmt"
	"net/url"
	"strings"
)

// attachPath is where engines serve the worker WebSocket (PROTOCOL.md §1).
const attachPath = "/api/v1/workers/attach"

// completeURL turns what a person pastes into the worker endpoint: the
// engine's web address (https://engine.example.com) becomes
// wss://engine.example.com/api/v1/workers/attach. An explicit path is kept,
// for engines behind a proxy prefix. The warning, if any, is for a path that
// does not look like an attach endpoint.
func completeURL(raw string) (endpoint, warning string, err error) {
	raw = strings.TrimSpace(raw)
	example := "e.g. wss://engine.example.com" + attachPath + " or just https://engine.example.com"
	u, err := url.Parse(raw)
	if err != nil || raw == "" {
		return "", "", fmt.Errorf("--url %q is not a URL; give the engine's address, %s", raw, example)
	}
	switch strings.ToLower(u.Scheme) {
	case "wss", "https":
		u.Scheme = "wss"
	case "ws", "http":
		u.Scheme = "ws"
	case "":
		return "", "", fmt.Errorf("--url %q has no scheme; %s", raw, example)
	default:
		return "", "", fmt.Errorf("--url %q: the scheme must be wss:// or https:// (ws:// or http:// without TLS), not %s://; %s", raw, u.Scheme, example)
	}
	if u.Host == "" {
		return "", "", fmt.Errorf("--url %q has no host; %s", raw, example)
	}
	if u.Query().Has("token") {
		// The agent adds the token itself; one in the URL would sit in the
		// config's url key and in every log line that shows the URL.
		return "", "", fmt.Errorf("--url must not carry the token; remove ?token=… and pass it with --token - (stdin) or --token-file")
	}
	if u.Fragment != "" {
		return "", "", fmt.Errorf("--url %q: a #fragment means nothing to the engine; remove it", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = attachPath
	} else if !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/workers/attach") {
		warning = fmt.Sprintf("--url path %q does not end in /workers/attach; engines serve workers at %s", u.Path, attachPath)
	}
	return u.String(), warning, nil
}
