package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHTTPBase(t *testing.T) {
	tests := []struct{ url, endpoint, want string }{
		{"wss://h/api/v1/workers/attach", "/artifacts", "https://h/api/v1/artifacts"},
		{"ws://h:8080/api/v1/workers/attach", "/artifacts", "http://h:8080/api/v1/artifacts"},
		{"wss://h/api/v1/workers/attach?token=s3cret&pool=a", "/artifacts", "https://h/api/v1/artifacts"},
		{"wss://h/api/v1/workers/attach", "/workers/runtime", "https://h/api/v1/workers/runtime"},
		{"wss://h/fluksio/api/v1/workers/attach/", "/artifacts", "https://h/fluksio/api/v1/artifacts"},
		{"wss://h/custom", "/artifacts", "https://h/custom/artifacts"},
	}
	for _, tt := range tests {
		if got := HTTPBase(tt.url, tt.endpoint); got != tt.want {
			t.Errorf("HTTPBase(%q, %q) = %q, want %q", tt.url, tt.endpoint, got, tt.want)
		}
	}
}

func TestArtifactBase(t *testing.T) {
	cfg := Config{URL: "wss://h/api/v1/workers/attach"}
	if got := cfg.ArtifactBase(); got != "https://h/api/v1/artifacts" {
		t.Errorf("derived artifact URL = %q", got)
	}
	cfg.URL = "wss://h/api/v1/workers/attach?token=s3cret"
	if got := cfg.ArtifactBase(); got != "https://h/api/v1/artifacts" {
		t.Errorf("derived artifact URL with a query = %q (the token must not travel in it)", got)
	}
	cfg.ArtifactURL = "https://store.example.com/a"
	if got := cfg.ArtifactBase(); got != "https://store.example.com/a" {
		t.Errorf("--artifact-url ignored: %q", got)
	}
}

func TestResolveStateDir(t *testing.T) {
	base := t.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(base, "flag", "state")
	dir, err := ResolveStateDir(cfg, envMap(map[string]string{"STATE_DIRECTORY": filepath.Join(base, "systemd")}))
	if err != nil || dir != cfg.StateDir {
		t.Errorf("--state-dir: %q, %v", dir, err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Errorf("the state directory was not created: %v", err)
	}

	cfg.StateDir = ""
	systemd := filepath.Join(base, "systemd")
	dir, err = ResolveStateDir(cfg, envMap(map[string]string{"STATE_DIRECTORY": systemd + ":" + filepath.Join(base, "other")}))
	if err != nil || dir != systemd {
		t.Errorf("$STATE_DIRECTORY: %q, %v; want its first entry %q", dir, err, systemd)
	}

	notDir := filepath.Join(base, "file")
	os.WriteFile(notDir, nil, 0o644)
	cfg.StateDir = filepath.Join(notDir, "state")
	if _, err := ResolveStateDir(cfg, envMap(nil)); err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("unusable state dir: %v; want an error saying to set --state-dir", err)
	}
}
