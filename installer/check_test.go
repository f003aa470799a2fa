package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// check --json, against a real engine on loopback: every item of the
// help's list, for a script to read; and a wrong URL said as run says it.
func TestCheckJSON(t *testing.T) {
	if !exists("/usr/bin/python3") {
		t.Skip("no /usr/bin/python3")
	}
	const token = "check-json-token-7d1e0b"
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{token}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	h := testHost(t, 1000)
	check1 := func(url string) (int, string) {
		var out, errs bytes.Buffer
		code := check(context.Background(), h, []string{"--url", url, "--token", token, "--python", "/usr/bin/python3", "--runtime", "embedded", "--json"}, &out, &errs)
		return code, out.String() + errs.String()
	}
	code, out := check1(eng.AttachURL())
	var report struct {
		OK    bool `json:"ok"`
		Items []struct{ Item, Result, Detail string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != config.ExitOK || !report.OK {
		t.Fatalf("check --json: exit %d (%v)\n%s", code, err, out)
	}
	var items []string
	for _, it := range report.Items {
		items = append(items, it.Item)
	}
	var help bytes.Buffer
	writeCheckUsage(&help)
	for _, want := range []string{"config", "python", "runtime", "inventory", "contain", "engine", "token"} {
		if !strings.Contains(strings.Join(items, " "), want) {
			t.Errorf("check --json has no %s item: %v", want, items)
		}
		if !strings.Contains(help.String(), "\n  "+want+" ") {
			t.Errorf("check --help does not list the %s item", want)
		}
	}

	code, out = check1("wss://" + eng.Addr())
	if code != config.ExitFailed || !strings.Contains(out, "does not speak TLS: use ws://"+eng.Addr()) {
		t.Errorf("check with wss:// against a server without TLS: exit %d\n%s", code, out)
	}
}

// check of an installed worker that runs says the containment the service
// uses, from its status file, not what this shell would get, and says that
// too when it differs: the service decides in its own cgroup.
func TestCheckSaysTheRunningServicesContainment(t *testing.T) {
	if !exists("/usr/bin/python3") {
		t.Skip("no /usr/bin/python3")
	}
	const token = "check-contain-token-51ac2e"
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{token}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	h, l := userLayout(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(l.ConfigDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	cfgText := fmt.Sprintf("url = %q\ntoken = %q\npython = \"/usr/bin/python3\"\nruntime = \"embedded\"\nstate-dir = %q\n", eng.AttachURL(), token, stateDir)
	if err := os.WriteFile(l.ConfigPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(l.UnitPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.UnitPath, []byte("[Service]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check1 := func() string {
		var out, errs bytes.Buffer
		check(context.Background(), h, nil, &out, &errs)
		return out.String() + errs.String()
	}
	here := runner.ProbeContainment("auto")
	if out := check1(); !strings.Contains(out, "contain    "+here+": ") || !strings.Contains(out, "the service decides in its own cgroup when it starts") {
		t.Errorf("check of an installed worker that does not run: want this shell's %s, and that the service decides itself:\n%s", here, out)
	}
	// The service runs (this process stands for it) with another mode.
	theirs := platform.ContainCgroup
	if here == theirs {
		theirs = platform.ContainSubreaper
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	status.NewFile(stateDir, status.Status{PID: os.Getpid(), State: status.StateAttached, Containment: theirs}, logging.NewRedactor(""), func(err error) { t.Error(err) }).Flush()
	out := check1()
	if !strings.Contains(out, "contain    "+theirs+" (the running service's)") || !strings.Contains(out, "a worker started from this shell would get "+here) {
		t.Errorf("check of a running service using %s (this shell: %s): want the service's, and this shell's beside it:\n%s", theirs, here, out)
	}
}
