package installer

import (
	"strings"
	"testing"
)

func TestCompleteURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://engine.example.com", "wss://engine.example.com/api/v1/workers/attach"},
		{"https://engine.example.com/", "wss://engine.example.com/api/v1/workers/attach"},
		{"wss://engine.example.com", "wss://engine.example.com/api/v1/workers/attach"},
		{"http://127.0.0.1:8080", "ws://127.0.0.1:8080/api/v1/workers/attach"},
		{"ws://localhost:9000", "ws://localhost:9000/api/v1/workers/attach"},
		{"HTTPS://Engine.example.com", "wss://Engine.example.com/api/v1/workers/attach"},
		{"  wss://e.example.com/api/v1/workers/attach  ", "wss://e.example.com/api/v1/workers/attach"},
		// A proxy prefix is the user's to keep.
		{"https://example.com/fluksio/api/v1/workers/attach", "wss://example.com/fluksio/api/v1/workers/attach"},
	} {
		got, warning, err := completeURL(tc.in)
		if err != nil || got != tc.want || warning != "" {
			t.Errorf("completeURL(%q) = %q, %q, %v; want %q", tc.in, got, warning, err, tc.want)
		}
	}
}

func TestCompleteURLWarnsAboutAnOddPath(t *testing.T) {
	got, warning, err := completeURL("https://engine.example.com/dashboard")
	if err != nil || got != "wss://engine.example.com/dashboard" {
		t.Fatalf("got %q, %v", got, err)
	}
	if !strings.Contains(warning, "/api/v1/workers/attach") {
		t.Errorf("warning %q should name the usual path", warning)
	}
}

func TestCompleteURLRejects(t *testing.T) {
	for _, tc := range []struct{ in, says string }{
		{"ftp://engine.example.com", "scheme must be wss:// or https://"},
		{"file:///etc/passwd", "scheme must be wss:// or https://"},
		{"engine.example.com", "no scheme; write wss://engine.example.com"},
		{"localhost:18765", "no scheme; write ws://localhost:18765"},
		{"127.0.0.1:18765/api/v1/workers/attach", "no scheme; write ws://127.0.0.1:18765/api/v1/workers/attach"},
		{"wss://u:hunter2@engine.example.com", `"wss://u:REDACTED@engine.example.com" carries a user name or password`},
		{"", "not a URL"},
		{"https://", "no host"},
		{"wss://e.example.com/api/v1/workers/attach?token=SECRET", "must not carry the token"},
		{"https://e.example.com/#x", "fragment"},
	} {
		_, _, err := completeURL(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("completeURL(%q) error %v; want one saying %q", tc.in, err, tc.says)
		}
		if err != nil && (strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "hunter2")) {
			t.Errorf("the error repeats the token: %v", err)
		}
	}
}
