package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// Item 4: a URL that can never work stops the worker at start with what to
// write, instead of being retried forever.
func TestBadURLsStopAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, says string }{
		{"ws://", "no host"},
		{"ws:///x", "no host"},
		{"ws://h:99999/x", "port"},
		{"ws://user:hunter2@h/api/v1/workers/attach", "user name or password"},
		{"ftp://h/x", "scheme"},
		{"h.example.com", "no scheme; write wss://h.example.com"},
	} {
		w := startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
			"run", "--url", tc.url, "--python", fakeRunnerPath(t), "--state-dir", t.TempDir())
		if code := w.wait(15 * time.Second); code != 2 {
			t.Errorf("--url %s: exit %d, want 2", tc.url, code)
		}
		logs := w.logs.String()
		if !strings.Contains(logs, tc.says) || !strings.Contains(logs, "wss://") {
			t.Errorf("--url %s: the message does not say %q and what to write:\n%s", tc.url, tc.says, logs)
		}
		if strings.Contains(logs, "hunter2") {
			t.Errorf("--url %s: the password is repeated:\n%s", tc.url, logs)
		}
	}
}

// Item 4: run and check complete a URL as install does: the engine's web
// address, any case, means its worker endpoint.
func TestRunAndCheckCompleteTheURL(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	for _, given := range []string{"http://" + eng.Addr(), "HTTP://" + eng.Addr() + "/", "Ws://" + eng.Addr()} {
		w := startWorker(t, eng, nil, "--url", given)
		attach(t, eng)
		w.signal(syscall.SIGTERM)
		if code := w.wait(20 * time.Second); code != 0 {
			t.Fatalf("--url %s: exit %d", given, code)
		}
		if !strings.Contains(w.logs.String(), "engine=ws://"+eng.Addr()+"/api/v1/workers/attach") {
			t.Errorf("--url %s: not completed:\n%s", given, w.logs.String())
		}
	}
	check := startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, "check",
		"--url", "http://"+eng.Addr(), "--python", fakeRunnerPath(t), "--runtime", "embedded")
	if code := check.wait(60 * time.Second); code != 0 || !strings.Contains(check.logs.String(), "ws://"+eng.Addr()+"/api/v1/workers/attach answers") {
		t.Errorf("check with the web address: exit %d\n%s", code, check.logs.String())
	}
}

// Item 4: a redirect on the upgrade is logged with where it points (without
// its query).
func TestRedirectOnUpgradeSaysWhereItPoints(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{RedirectTo: "wss://new-engine.example.com/api/v1/workers/attach?sig=abc123"})
	w := startWorker(t, eng, nil)
	eventually(t, 20*time.Second, "the redirect in the log", func() bool {
		return strings.Contains(w.logs.String(), "redirects to wss://new-engine.example.com/api/v1/workers/attach")
	})
	if strings.Contains(w.logs.String(), "sig=abc123") {
		t.Errorf("the redirect's query is shown:\n%s", w.logs.String())
	}
}

// Rough edge: an engine with a self-signed certificate says to use
// --ca-file; with it, the worker attaches and node processes trust it too,
// through SSL_CERT_FILE, with the system's authorities kept.
func TestSelfSignedEngineAndCAFile(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{TLS: true})
	dir := t.TempDir()
	ca := filepath.Join(dir, "engine-ca.pem")
	os.WriteFile(ca, eng.CACertPEM(), 0o644)

	w := startWorker(t, eng, nil)
	eventually(t, 20*time.Second, "the --ca-file hint", func() bool {
		return strings.Contains(w.logs.String(), "--ca-file")
	})
	w.cmd.Process.Kill()

	// The variable, the flag and a config key relative to its file.
	config := filepath.Join(dir, "config.toml")
	os.WriteFile(config, []byte("ca-file = \"engine-ca.pem\"\n"), 0o600)
	for _, how := range [][]string{{"--ca-file", ca}, {"--config", config}} {
		w = startWorker(t, eng, nil, how...)
		wk := attach(t, eng)
		env := runnerEnv(t, wk, "SSL_CERT_FILE", "FLUKSIO_CA_FILE")
		bundle, err := os.ReadFile(env["SSL_CERT_FILE"])
		if err != nil || !strings.Contains(string(bundle), string(eng.CACertPEM())) {
			t.Fatalf("%v: SSL_CERT_FILE=%q does not hold the CA (%v)", how, env["SSL_CERT_FILE"], err)
		}
		if env["FLUKSIO_CA_FILE"] != ca {
			t.Errorf("%v: FLUKSIO_CA_FILE = %q, want %s", how, env["FLUKSIO_CA_FILE"], ca)
		}
		if python, err := exec.LookPath("python3"); err == nil {
			// What the runtime's artifact requests do: Python's default
			// TLS context, which reads SSL_CERT_FILE.
			digest := eng.PutArtifact([]byte("weights"))
			script := `import sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
sys.stdout.write(urllib.request.urlopen(req).read().decode())`
			cmd := exec.Command(python, "-c", script, eng.BaseURL()+"/api/v1/artifacts/"+digest, testToken)
			cmd.Env = append(cleanEnv(), "SSL_CERT_FILE="+env["SSL_CERT_FILE"])
			if out, err := cmd.CombinedOutput(); err != nil || string(out) != "weights" {
				t.Errorf("Python with the node environment cannot load from the store: %v\n%s", err, out)
			}
		}
		w.signal(syscall.SIGTERM)
		w.wait(20 * time.Second)
	}
	w = startWorker(t, eng, []string{"FLUKSIO_WORKER_CA_FILE=" + ca})
	attach(t, eng)
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
}

// Rough edges: a token file with a byte order mark and blank lines before
// the token works; one others can read, or a config holding the token
// that others can read, gets a warning naming its mode; a relative
// token-file in a config is relative to the config; a relative
// --state-dir reaches node processes absolute.
func TestTokenFilesAndRelativePaths(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token"), []byte("\uFEFF\n\n  "+testToken+"\r\n"), 0o644)
	config := filepath.Join(dir, "config.toml")
	os.WriteFile(config, []byte(`token-file = "token"`+"\n"), 0o600)
	elsewhere := t.TempDir()
	env := cleanEnv()
	w := startIn(t, elsewhere, env, "run", "--config", config, "--url", eng.AttachURL(),
		"--python", fakeRunnerPath(t), "--runtime", "embedded", "--state-dir", "state")
	wk := attach(t, eng)
	got := runnerEnv(t, wk, "FLUKSIO_ARTIFACT_CACHE")
	// In the state directory (state/artifacts), or in the call's own
	// directory in it where a sandbox keeps each call's cache apart.
	if state := filepath.Join(elsewhere, "state"); !strings.HasPrefix(got["FLUKSIO_ARTIFACT_CACHE"], state+"/") {
		t.Errorf("FLUKSIO_ARTIFACT_CACHE = %q, want an absolute path in %s", got["FLUKSIO_ARTIFACT_CACHE"], state)
	}
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
	if logs := w.logs.String(); !strings.Contains(logs, "mode 0644") || !strings.Contains(logs, "chmod 600") {
		t.Errorf("no warning about the token file's mode:\n%s", logs)
	}

	b, _ := json.Marshal(testToken)
	os.WriteFile(config, []byte("token = "+string(b)+"\n"), 0o640)
	os.Chmod(config, 0o640)
	w = startWorker(t, eng, nil, "--config", config)
	attach(t, eng)
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
	if logs := w.logs.String(); !strings.Contains(logs, "mode 0640") {
		t.Errorf("no warning about the config's mode:\n%s", logs)
	}
}

// Rough edge: numbers no one can mean are refused with the reason, not
// overflowed, wrapped or accepted.
func TestNumbersThatCannotBeMeant(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--max-idle", "1e10"},
		{"--cancel-grace", "1e300"},
		{"--max-line", "9999999999999GiB"},
		{"--parallel", "100000"},
		{"--cpus", "99999999999"},
		{"--cpus", "99999999999999999999999"},
	} {
		w := startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, append([]string{"run",
			"--url", "ws://127.0.0.1:1/api/v1/workers/attach", "--python", fakeRunnerPath(t), "--state-dir", t.TempDir()}, args...)...)
		if code := w.wait(15 * time.Second); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if logs := w.logs.String(); !strings.Contains(logs, "at most") && !strings.Contains(logs, "too large") {
			t.Errorf("%v: the message does not give the limit:\n%s", args, logs)
		}
	}
}

// Rough edge: install checks its options before it asks the service
// manager anything, so bad options are reported on any machine.
func TestInstallValidatesBeforeTheServiceManager(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--parallel", "0"},
		{"--url", "ws:///x"},
		{"--max-line", "12XB"},
	} {
		w := startBinary(t, nil, append([]string{"install", "--url", "https://engine.example.com", "--token", "-"}, args...)...)
		if code := w.wait(15 * time.Second); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, w.logs.String())
		}
		if logs := w.logs.String(); !strings.Contains(logs, args[0]) || strings.Contains(logs, "service manager") {
			t.Errorf("%v: the message should name the option, not the service manager:\n%s", args, logs)
		}
	}
}

// Rough edge: selftest stopped by SIGTERM removes its temporary directory.
func TestSelftestCleansUpOnSIGTERM(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	// A Python that passes the version check, then hangs in the first call.
	slow := filepath.Join(tmp, "slowpython")
	os.WriteFile(slow, []byte("#!/bin/sh\nif [ \"$1\" = -c ]; then echo 3.11.0; exit 0; fi\nexec sleep 60\n"), 0o755)
	w := startBinary(t, []string{"TMPDIR=" + tmp}, "selftest", "--python", slow)
	var dirs []string
	eventually(t, 20*time.Second, "the selftest directory", func() bool {
		dirs, _ = filepath.Glob(filepath.Join(tmp, "fluksio-selftest-*"))
		return len(dirs) > 0 && exists(filepath.Join(dirs[0], "state", "runtime"))
	})
	time.Sleep(500 * time.Millisecond)
	w.signal(syscall.SIGTERM)
	w.wait(30 * time.Second)
	if left, _ := filepath.Glob(filepath.Join(tmp, "fluksio-selftest-*")); len(left) > 0 {
		t.Errorf("selftest left %v", left)
	}
}
