package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

// AttachPath is where engines serve the worker WebSocket (the protocol's
// section 1); a URL given without a path gets it.
const AttachPath = "/api/v1/workers/attach"

// CompleteURL is the one place a URL a person gives becomes the worker
// endpoint, for run, check and install alike. The engine's web address is
// enough: https://engine.example.com becomes
// wss://engine.example.com/api/v1/workers/attach (http means ws), schemes
// are read in any case, and an explicit path is kept, for engines behind a
// proxy prefix. Everything dialing would trip on later (no host, a port
// out of range, credentials, the token in the query) is an error now, so a
// worker does not retry a URL that can never work. Errors show the URL
// without its query and credentials. The warning, if any, is for a path
// that does not look like an attach endpoint.
func CompleteURL(raw string) (endpoint, warning string, err error) {
	raw = strings.TrimSpace(raw)
	shown := logging.ShownURL(raw)
	example := "e.g. wss://engine.example.com" + AttachPath + " or just https://engine.example.com"
	if raw != "" && !strings.Contains(raw, "://") {
		return "", "", fmt.Errorf("--url %q has no scheme; write %s://%s (ws:// for an engine without TLS, wss:// with it)", shown, suggestScheme(raw), shown)
	}
	u, perr := url.Parse(raw)
	if perr != nil || raw == "" {
		return "", "", fmt.Errorf("--url %q is not a URL; give the engine's address, %s", shown, example)
	}
	switch strings.ToLower(u.Scheme) {
	case "wss", "https":
		u.Scheme = "wss"
	case "ws", "http":
		u.Scheme = "ws"
	case "":
		return "", "", fmt.Errorf("--url %q has no scheme; %s", shown, example)
	default:
		return "", "", fmt.Errorf("--url %q: the scheme must be wss:// or https:// (ws:// or http:// without TLS), not %s://; %s", shown, u.Scheme, example)
	}
	if u.User != nil {
		// A password here would sit in the config and in every place the
		// URL is shown; engines authenticate workers by token alone.
		return "", "", fmt.Errorf("--url %q carries a user name or password (NAME:PASSWORD@ before the host); remove it, the engine knows a worker by its token alone (--token-file); %s", shown, example)
	}
	if u.Hostname() == "" {
		return "", "", fmt.Errorf("--url %q has no host; %s", shown, example)
	}
	if p := u.Port(); p != "" || strings.HasSuffix(u.Host, ":") {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return "", "", fmt.Errorf("--url %q: port %q is not a port number (1 to 65535); write host:port, e.g. wss://engine.example.com:8443, or leave the port out", shown, p)
		}
	}
	if strings.ContainsAny(u.Hostname(), " \t") || (strings.Contains(u.Hostname(), ":") && net.ParseIP(u.Hostname()) == nil) {
		return "", "", fmt.Errorf("--url %q: %q is not a host name; %s", shown, u.Hostname(), example)
	}
	if u.Query().Has("token") {
		// The worker adds the token itself; one in the URL would sit in the
		// config's url key and in every place that shows the URL.
		return "", "", fmt.Errorf("--url must not carry the token; remove ?token=… and pass it with --token-file, FLUKSIO_WORKER_TOKEN or (for install) --token -")
	}
	if u.Fragment != "" {
		return "", "", fmt.Errorf("--url %q: a #fragment means nothing to the engine; remove it", shown)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = AttachPath
	} else if !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/workers/attach") {
		warning = fmt.Sprintf("--url path %q does not end in /workers/attach; engines serve workers at %s", u.Path, AttachPath)
	}
	return u.String(), warning, nil
}

// suggestScheme is the scheme to suggest for a URL written without one:
// ws for this machine (a test engine, a tunnel), wss elsewhere.
func suggestScheme(raw string) string {
	host, _, _ := strings.Cut(raw, "/")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return "ws"
	}
	return "wss"
}

// ArtifactBase is where node code saves and loads artifacts
// (FLUKSIO_ARTIFACT_URL): --artifact-url, else derived from --url.
func (c Config) ArtifactBase() string {
	if c.ArtifactURL != "" {
		return c.ArtifactURL
	}
	return HTTPBase(c.URL, "/artifacts")
}

// HTTPBase is the engine's HTTP address beside the socket, the way the
// protocol derives the artifact URL: ws->http, wss->https, and the tail
// /workers/attach replaced by the endpoint asked for.
func HTTPBase(socketURL, endpoint string) string {
	base := socketURL
	if i := strings.IndexByte(base, '?'); i >= 0 {
		base = base[:i]
	}
	switch {
	case strings.HasPrefix(base, "wss://"):
		base = "https://" + base[len("wss://"):]
	case strings.HasPrefix(base, "ws://"):
		base = "http://" + base[len("ws://"):]
	}
	if i := strings.LastIndex(base, "/workers/attach"); i >= 0 {
		base = base[:i]
	}
	return base + endpoint
}
