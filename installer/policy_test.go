package installer

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/status"
)

// TestCheckAndStatusShowThePolicy: check has a policy item that says
// which code runs and which hooks are asked, and status shows the policy
// the running worker wrote.
func TestCheckAndStatusShowThePolicy(t *testing.T) {
	if !exists("/usr/bin/python3") {
		t.Skip("no /usr/bin/python3")
	}
	hook := filepath.Join(t.TempDir(), "gpu-free.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	got := checkItems(t, "--allow-module", "acme.*", "--allow-source", "none", "--pre-call-hook", hook)
	policy := got["policy"]
	if !strings.Contains(got["runtime"], "embedded") {
		t.Errorf("with a code policy, check's runtime is %s", got["runtime"])
	}
	for _, want := range []string{"code policy on: runs modules acme.* only and no shipped source", "env may set only tuning variables", `pre-call hook "` + hook + `"`} {
		if !strings.Contains(policy, want) {
			t.Errorf("check's policy item %q does not say %q", policy, want)
		}
	}

	l, _ := layoutFor("linux", false, dirs{})
	var out bytes.Buffer
	writeStatus(&out, l, Running, status.Status{PID: 1, State: "attached", Policy: "code policy off: any module and any shipped source run"}, nil)
	if !strings.Contains(out.String(), "policy:   code policy off") {
		t.Errorf("status does not show the policy:\n%s", out.String())
	}
}

// TestInstallTrustsEveryKeyGiven: install --trust-key (and --allow-env)
// given twice writes both values to the config, as run takes them, not
// the last alone; a pattern that is none is refused before anything else.
func TestInstallTrustsEveryKeyGiven(t *testing.T) {
	req, err := parseInstall([]string{"--url", "wss://e.example.com", "--trust-key", "/etc/keys/a.pub", "--trust-key", "/etc/keys/b.pub",
		"--allow-env", "WANDB_*", "--allow-env", "SEED"})
	if err != nil {
		t.Fatal(err)
	}
	if got := req.given["trust-key"]; got != "/etc/keys/a.pub,/etc/keys/b.pub" {
		t.Errorf("install keeps --trust-key %q", got)
	}
	if got := req.given["allow-env"]; got != "WANDB_*,SEED" {
		t.Errorf("install keeps --allow-env %q", got)
	}
}
