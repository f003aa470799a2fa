package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// The token must never be visible in the process list or the log, however
// it was given (except on the command line, which the user chose).
func TestTokenNeverInCmdlineOrLogs(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600)
	config := filepath.Join(dir, "config.toml")
	os.WriteFile(config, []byte(`url = "`+eng.AttachURL()+`"
token = "`+testToken+`"
python = "`+fakeRunnerPath(t)+`"
runtime = "embedded"
state-dir = "`+filepath.Join(dir, "state")+`"
log-level = "debug"
`), 0o600)

	for _, tc := range []struct {
		name string
		w    func() *worker
	}{
		{"env", func() *worker { return startWorker(t, eng, nil) }},
		{"token-file", func() *worker {
			return startBinary(t, nil, "run", "--url", eng.AttachURL(), "--token-file", tokenFile,
				"--python", fakeRunnerPath(t), "--runtime", "embedded", "--state-dir", t.TempDir(), "--log-level", "debug")
		}},
		{"config", func() *worker { return startBinary(t, nil, "run", "--config", config) }},
		{"json logs", func() *worker { return startWorker(t, eng, nil, "--log-format", "json") }},
	} {
		w := tc.w()
		wk := attach(t, eng)
		// A call, a garbage line and a runner that prints the token on
		// stderr (node code might): the agent's own lines never carry it.
		answer, _ := wait(t, run(t, wk, "s1", step{"raw": "garbage"}, step{"events": 1}))
		if !answer.OK {
			t.Fatalf("%s: %s", tc.name, answer.Raw)
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", w.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(cmdline), testToken) {
			t.Errorf("%s: the token is in /proc/PID/cmdline", tc.name)
		}
		// Drop the connection so reconnect and disconnect paths log too.
		wk.Drop()
		attach(t, eng)
		w.signal(15)
		if code := w.wait(20 * time.Second); code != 0 {
			t.Fatalf("%s: exit %d", tc.name, code)
		}
		logs := w.logs.String()
		if strings.Contains(logs, testToken) {
			t.Errorf("%s: the token is in the log:\n%s", tc.name, logs)
		}
		if !strings.Contains(logs, "attached") {
			t.Errorf("%s: the log says nothing useful:\n%s", tc.name, logs)
		}
	}
}

// The redaction is a real safety net: a token that shows up inside an
// error (here the engine echoes it in a refusal) is replaced in the log.
func TestTokenInEngineTextIsRedacted(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{Refuse: "token " + testToken + " is revoked"})
	w := startWorker(t, eng, nil)
	if code := w.wait(20 * time.Second); code != 1 {
		t.Fatalf("exit %d", code)
	}
	logs := w.logs.String()
	if strings.Contains(logs, testToken) || !strings.Contains(logs, "token REDACTED is revoked") {
		t.Errorf("log:\n%s", logs)
	}
}
