package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// TestCheckAndStatusShowThePolicy: check has a policy item that says
// which code runs and which hooks are asked, and status shows the policy
// the running worker wrote.
func TestCheckAndStatusShowThePolicy(t *testing.T) {
	if !exists("/usr/bin/python3") {
		t.Skip("no /usr/bin/python3")
	}
	const token = "check-policy-token-41c9a2"
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{token}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	var out, errs bytes.Buffer
	check(context.Background(), testHost(t, 1000), []string{"--url", eng.AttachURL(), "--token", token, "--python", "/usr/bin/python3",
		"--allow-module", "acme.*", "--allow-source", "none", "--pre-call-hook", "/etc/fluksio-worker/gpu-free.sh", "--json"}, &out, &errs)
	var report struct {
		Items []struct{ Item, Result, Detail string }
	}
	if err := json.Unmarshal(out.Bytes(), &report); err != nil {
		t.Fatalf("check --json: %v\n%s%s", err, out.String(), errs.String())
	}
	var policy string
	for _, it := range report.Items {
		if it.Item == "policy" {
			policy = it.Detail
		}
		if it.Item == "runtime" && !strings.Contains(it.Detail, "embedded") {
			t.Errorf("with a code policy, check's runtime is %s", it.Detail)
		}
	}
	for _, want := range []string{"modules acme.*", "source none", "env may not load code", `pre-call hook "/etc/fluksio-worker/gpu-free.sh"`} {
		if !strings.Contains(policy, want) {
			t.Errorf("check's policy item %q does not say %q", policy, want)
		}
	}

	l, _ := layoutFor("linux", false, dirs{})
	out.Reset()
	writeStatus(&out, l, Running, status.Status{PID: 1, State: "attached", Policy: "code policy off (any module, any source)"}, nil)
	if !strings.Contains(out.String(), "policy:   code policy off") {
		t.Errorf("status does not show the policy:\n%s", out.String())
	}
}

// TestInstallTrustsEveryKeyGiven: install --trust-key given twice writes
// both keys to the config, as run takes them, not the last alone.
func TestInstallTrustsEveryKeyGiven(t *testing.T) {
	req, err := parseInstall([]string{"--url", "wss://e.example.com", "--trust-key", "/etc/keys/a.pub", "--trust-key", "/etc/keys/b.pub"})
	if err != nil {
		t.Fatal(err)
	}
	if got := req.given["trust-key"]; got != "/etc/keys/a.pub,/etc/keys/b.pub" {
		t.Errorf("install keeps --trust-key %q", got)
	}
}
