package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every path in a config file is read against the file's directory, as the
// README says, whatever directory the worker starts in: trusted keys and a
// hook's script as well as the token file.
func TestConfigPathsAreTheFilesOwn(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"ci-key.pub", "keys/other.pub"} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
		os.WriteFile(filepath.Join(dir, f), []byte("x\n"), 0o644)
	}
	os.Mkdir(filepath.Join(dir, "hooks"), 0o755)
	os.WriteFile(filepath.Join(dir, "hooks", "gpu.sh"), []byte("#!/bin/sh\n"), 0o755)
	path := filepath.Join(dir, "config.toml")
	os.WriteFile(path, []byte(`trust-key = ["ci-key.pub", "keys/other.pub", "/abs/k.pub"]
ca-file = "ca.pem"
pre-call-hook = "hooks/gpu.sh --min 8"
post-call-hook = "logger -t fluksio done"
`), 0o600)
	t.Chdir(t.TempDir()) // anywhere but the file's directory
	cfg := mustLoad(t, []string{"--config", path}, nil)
	want := []string{filepath.Join(dir, "ci-key.pub"), filepath.Join(dir, "keys/other.pub"), "/abs/k.pub"}
	if strings.Join(cfg.TrustKeys, ",") != strings.Join(want, ",") {
		t.Errorf("trust-key read as %q, want %q", cfg.TrustKeys, want)
	}
	if cfg.CAFile != filepath.Join(dir, "ca.pem") {
		t.Errorf("ca-file read as %q", cfg.CAFile)
	}
	if want := filepath.Join(dir, "hooks/gpu.sh") + " --min 8"; cfg.PreCallHook != want {
		t.Errorf("pre-call-hook read as %q, want %q", cfg.PreCallHook, want)
	}
	if cfg.PostCallHook != "logger -t fluksio done" {
		t.Errorf("a command found on PATH was changed: %q", cfg.PostCallHook)
	}
}

// A hook's script that cannot run would decline every call with
// "Permission denied": the configuration is refused before the worker
// dials (and so by check-config and check), saying what to do.
func TestAHookThatCannotRunIsRefused(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "gpu-check.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o644)
	tok := writeToken(t, "tok-0123456789abcdef")
	for _, flagName := range []string{"--pre-call-hook", "--post-call-hook"} {
		cfg := mustLoad(t, []string{"--url", "wss://e.example.com/x", "--token-file", tok, flagName, script + " --min 8"}, nil)
		wantUsageError(t, cfg.Resolve(), flagName, script, "no run bit", "chmod +x "+script)
		cfg = mustLoad(t, []string{"--url", "wss://e.example.com/x", "--token-file", tok, flagName, filepath.Join(dir, "missing.sh")}, nil)
		wantUsageError(t, cfg.Resolve(), flagName, "does not exist")
	}
	os.Chmod(script, 0o755)
	cfg := mustLoad(t, []string{"--url", "wss://e.example.com/x", "--token-file", tok, "--pre-call-hook", script}, nil)
	if err := cfg.Resolve(); err != nil {
		t.Errorf("a runnable hook: %v", err)
	}
}
