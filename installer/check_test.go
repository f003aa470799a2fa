package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
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
