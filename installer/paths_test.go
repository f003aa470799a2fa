package installer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// A relative --trust-key, as keygen's hint writes it, or a relative hook
// script, is written absolute: the service starts elsewhere, and its
// config reads relative paths against the config's own directory.
func TestInstallWritesRelativePathsAbsolute(t *testing.T) {
	h, l := userLayout(t)
	work := t.TempDir()
	os.WriteFile(filepath.Join(work, "ci-key.pub"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(work, "gpu.sh"), []byte("#!/bin/sh\nexit 0\n"), 0o755)
	t.Chdir(work)
	req, err := parseInstall([]string{"--url", "https://e.example.com", "--token", "t",
		"--trust-key", "ci-key.pub", "--trust-key", "/etc/keys", "--pre-call-hook", "./gpu.sh --min 8", "--post-call-hook", "logger done"})
	if err != nil {
		t.Fatal(err)
	}
	values, _, err := installSettings(context.Background(), h, l, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(work, "ci-key.pub") + ",/etc/keys"; values["trust-key"] != want {
		t.Errorf("trust-key written as %v, want %q", values["trust-key"], want)
	}
	if want := filepath.Join(work, "gpu.sh") + " --min 8"; values["pre-call-hook"] != want {
		t.Errorf("pre-call-hook written as %v, want %q", values["pre-call-hook"], want)
	}
	if values["post-call-hook"] != "logger done" {
		t.Errorf("a command found on PATH was changed: %v", values["post-call-hook"])
	}
}

// The system service has a private /tmp and /var/tmp (PrivateTmp=yes): a
// key, a hook or a CA file there is refused at install, saying what to do,
// as the binary and Python are; a user service sees the machine's /tmp.
func TestInstallRefusesWhatTheServiceCannotSeeInTmp(t *testing.T) {
	system, _ := layoutFor("linux", false, dirs{Home: "/root"})
	user, _ := layoutFor("linux", true, dirs{Home: "/home/ada"})
	exe := "/usr/local/bin/fluksio-worker"
	for _, tc := range []struct {
		cfg  config.Config
		says string
	}{
		{config.Config{TrustKeys: []string{"/etc/k.pub", "/tmp/ci-key.pub"}}, "--trust-key is at /tmp/ci-key.pub"},
		{config.Config{PreCallHook: "/tmp/gpu.sh --min 8"}, "--pre-call-hook's program is at /tmp/gpu.sh"},
		{config.Config{PostCallHook: "/var/tmp/clean.sh"}, "--post-call-hook's program is at /var/tmp/clean.sh"},
		{config.Config{CAFile: "/tmp/ca.pem"}, "--ca-file is at /tmp/ca.pem"},
	} {
		tc.cfg.Python = "/usr/bin/python3"
		err := checkLocations(system, exe, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "move it to") {
			t.Errorf("%+v: %v; want an error saying %q and what to do", tc.cfg, err, tc.says)
		}
		if err := checkLocations(user, exe, tc.cfg); err != nil {
			t.Errorf("a user service sees /tmp: %v", err)
		}
	}
	if !strings.Contains(systemUnit, "\nPrivateTmp=yes\n") {
		t.Error("the system unit no longer has PrivateTmp=yes: check what checkLocations refuses")
	}
}

// A hook script saved without its run bit: install refuses before it
// writes anything, and check fails (exit 1) saying chmod +x.
func TestAHookWithoutItsRunBitIsRefused(t *testing.T) {
	script := filepath.Join(t.TempDir(), "gpu-check.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o644)

	h, l := userLayout(t)
	req, _ := parseInstall([]string{"--url", "https://e.example.com", "--token", "t", "--pre-call-hook", script})
	values, _, err := installSettings(context.Background(), h, l, req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = loadConfig(values) // what install checks before it writes
	var usage *config.UsageError
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), "chmod +x "+script) {
		t.Errorf("install: %v; want a usage error (exit 2) saying chmod +x", err)
	}

	var out, errs bytes.Buffer
	code := check(context.Background(), h, []string{"--url", "wss://127.0.0.1:1/x", "--token", "t", "--post-call-hook", script}, &out, &errs)
	if code != config.ExitFailed || !strings.Contains(out.String(), "FAIL") || !strings.Contains(out.String(), "chmod +x "+script) {
		t.Errorf("check: exit %d, out %q", code, out.String()+errs.String())
	}
}

// Root may run a hook that the service account may not (0744, root's):
// install and check ask as the account, and say what to do.
func TestAccountMustBeAbleToRunTheHook(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching accounts needs root")
	}
	acct, err := lookupAccount(context.Background(), "nobody")
	if err != nil {
		t.Skip("no nobody account here")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755) // t.TempDir's parent is root's alone
	script := filepath.Join(dir, "gpu-free.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o744)
	cfg := config.Config{PreCallHook: script + " --min 8"}
	err = accountCanUse(context.Background(), acct, cfg)
	if err == nil || !strings.Contains(err.Error(), "cannot run --pre-call-hook's program "+script) || !strings.Contains(err.Error(), "chmod +x") {
		t.Errorf("a hook only root may run: %v; want the account named, the file, and what to do", err)
	}
	os.Chmod(script, 0o755)
	if err := accountCanUse(context.Background(), acct, cfg); err != nil {
		t.Errorf("a hook everyone may run: %v", err)
	}
}
