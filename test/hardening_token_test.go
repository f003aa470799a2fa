package test

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// A token with characters that URL and JSON escaping change.
const oddToken = `tok+en/with=b64<&>"x`

// tokenForms are the ways oddToken shows up in text others wrote.
func tokenForms() []string {
	j, _ := json.Marshal(oddToken)
	return []string{
		oddToken,
		url.QueryEscape(oddToken),
		url.PathEscape(oddToken),
		strings.ToLower(url.QueryEscape(oddToken)),
		strings.Trim(string(j), `"`),
		"tok+en", "tok%2Ben",
	}
}

func assertNoToken(t *testing.T, where, text string) {
	t.Helper()
	for _, form := range tokenForms() {
		if strings.Contains(text, form) {
			t.Errorf("%s shows the token as %q:\n%s", where, form, text)
		}
	}
}

// Item 2: an engine whose error page echoes the request URL (Express's
// default 404 and 401 pages do) does not get the token into the log, the
// status file or `check`.
func TestTokenEchoedByTheEngineIsRedacted(t *testing.T) {
	t.Parallel()
	for _, status := range []int{404, 401} {
		eng := startEngine(t, enginetest.Options{EchoStatus: status, Tokens: []string{oddToken}})
		state := t.TempDir()
		w := startWorker(t, eng, []string{"FLUKSIO_WORKER_TOKEN=" + oddToken}, "--state-dir", state)
		eventually(t, 20*time.Second, "the status file's last error", func() bool {
			b, _ := os.ReadFile(filepath.Join(state, "status.json"))
			return strings.Contains(string(b), "Cannot GET")
		})
		if status == 404 {
			w.signal(syscall.SIGTERM)
		}
		w.wait(20 * time.Second)
		statusFile, _ := os.ReadFile(filepath.Join(state, "status.json"))
		assertNoToken(t, "the status file", string(statusFile))
		assertNoToken(t, "the log", w.logs.String())
		if !strings.Contains(string(statusFile), "token=REDACTED") {
			t.Errorf("the status file should still show what the engine said:\n%s", statusFile)
		}

		dir := t.TempDir()
		config := filepath.Join(dir, "config.toml")
		b, _ := json.Marshal(oddToken)
		os.WriteFile(config, []byte("url = \""+eng.AttachURL()+"\"\ntoken = "+string(b)+"\npython = \""+fakeRunnerPath(t)+"\"\nruntime = \"embedded\"\n"), 0o600)
		check := startBinary(t, nil, "check", "--config", config)
		check.wait(60 * time.Second)
		assertNoToken(t, "check", check.logs.String())
		if !strings.Contains(check.logs.String(), "FAIL") {
			t.Errorf("check did not fail:\n%s", check.logs.String())
		}
	}
}

// Item 2: a token too short to search for does not turn ordinary words into
// REDACTED; the worker says why it cannot hide it.
func TestShortTokenWarnsAndLeavesTheLogReadable(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{Tokens: []string{"e"}})
	w := startWorker(t, eng, []string{"FLUKSIO_WORKER_TOKEN=e"})
	wk := attach(t, eng)
	runOutputs(t, wk, "c1", step{"events": 1})
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
	logs := w.logs.String()
	if !strings.Contains(logs, "msg=attached") || strings.Contains(logs, "attachREDACTED") {
		t.Errorf("the log is mangled:\n%s", logs)
	}
	if !strings.Contains(logs, "shorter than 8") {
		t.Errorf("no warning about the short token:\n%s", logs)
	}
}
