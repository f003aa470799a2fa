package installer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// testHost is a host whose paths all lie under a temporary home.
func testHost(t *testing.T, euid int) host {
	home := t.TempDir()
	env := map[string]string{"HOME": home}
	return host{
		GOOS:       "linux",
		EUID:       euid,
		Stdin:      strings.NewReader(""),
		Getenv:     func(k string) string { return env[k] },
		Executable: os.Executable,
	}
}

func runInstall(t *testing.T, h host, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = install(context.Background(), h, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// parseInstall reads install's command line as install does, up to acting
// on it.
func parseInstall(args []string) (installRequest, error) {
	var req installRequest
	err := installCommand(&req).Parse(args)
	if err == nil {
		err = req.validate()
	}
	return req, err
}

func TestInstallWithoutRootSaysSudo(t *testing.T) {
	code, _, stderr := runInstall(t, testHost(t, 1000), "--url", "https://e.example.com", "--token", "t")
	if code != config.ExitFailed || !strings.Contains(stderr, "run it with sudo") || !strings.Contains(stderr, "--user-service") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

func TestInstallUserServiceRefusesRoot(t *testing.T) {
	// Root by sudo: run it without.
	h := testHost(t, 0)
	home := h.Getenv("HOME")
	h.Getenv = func(k string) string { return map[string]string{"HOME": home, "SUDO_USER": "ada"}[k] }
	code, _, stderr := runInstall(t, h, "--user-service", "--url", "https://e.example.com", "--token", "t")
	if code != config.ExitFailed || !strings.Contains(stderr, "without sudo") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	// Root by login: no sudo to leave out.
	code, _, stderr = runInstall(t, testHost(t, 0), "--user-service", "--url", "https://e.example.com", "--token", "t")
	if code != config.ExitFailed || strings.Contains(stderr, "sudo") || !strings.Contains(stderr, "run it as the user the worker is for") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

func TestInstallRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--user", "bob", "--user-service"}, "do not go together"},
		{[]string{"--token", "a", "--token-file", "/f"}, "not both"},
		{[]string{"--refresh-unit", "--labels", "gpu"}, "--refresh-unit only"},
		{[]string{"--colour", "red"}, "unknown option --colour"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		code, _, stderr := runInstall(t, testHost(t, 0), tc.args...)
		if code != config.ExitUsage || !strings.Contains(stderr, tc.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.says)
		}
	}
}

// userLayout is a user-service layout inside a temporary home.
func userLayout(t *testing.T) (host, Layout) {
	h := testHost(t, 1000)
	l, err := h.layout(true)
	if err != nil {
		t.Fatal(err)
	}
	return h, l
}

func TestInstallSettingsKeepUnrelatedKeys(t *testing.T) {
	h, l := userLayout(t)
	os.MkdirAll(l.ConfigDir(), 0o700)
	os.WriteFile(l.ConfigPath, []byte(`
url = "wss://old.example.com/api/v1/workers/attach"
token = "old-token"
labels = ["old"]
runtime = "embedded"
max-idle = 300
`), 0o600)
	req, err := parseInstall([]string{"--labels", "gpu, cuda12", "--parallel", "2", "--url", "https://new.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	values, _, err := installSettings(context.Background(), h, l, req)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"url":       "wss://new.example.com/api/v1/workers/attach",
		"token":     "old-token",
		"labels":    []string{"gpu", "cuda12"},
		"parallel":  int64(2),
		"runtime":   "embedded",
		"max-idle":  int64(300),
		"state-dir": l.StateDir,
	}
	for k, v := range want {
		if got := values[k]; !equalValue(got, v) {
			t.Errorf("%s = %#v, want %#v", k, got, v)
		}
	}
	python, _ := values["python"].(string)
	if !filepath.IsAbs(python) {
		t.Errorf("python %q is not an absolute path", python)
	}
	if _, err := loadConfig(values); err != nil {
		t.Errorf("the merged config does not load: %v", err)
	}
}

func equalValue(a, b any) bool {
	as, aok := a.([]string)
	bs, bok := b.([]string)
	if aok && bok {
		return strings.Join(as, ",") == strings.Join(bs, ",")
	}
	return a == b
}

func TestInstallSettingsReadTheTokenFromStdin(t *testing.T) {
	h, l := userLayout(t)
	os.MkdirAll(l.ConfigDir(), 0o700)
	// A config that pointed at a token file: the pasted token replaces it.
	os.WriteFile(l.ConfigPath, []byte("token-file = \"/old/token\"\n"), 0o600)
	h.Stdin = strings.NewReader("  pasted-token \nsecond line\n")
	req, _ := parseInstall([]string{"--url", "wss://e.example.com", "--token", "-"})
	values, _, err := installSettings(context.Background(), h, l, req)
	if err != nil {
		t.Fatal(err)
	}
	if values["token"] != "pasted-token" {
		t.Errorf("token %q", values["token"])
	}
	if _, ok := values["token-file"]; ok {
		t.Error("the old token-file key stayed, and run would read it instead")
	}

	h.Stdin = strings.NewReader("\n")
	if _, _, err := installSettings(context.Background(), h, l, req); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Errorf("empty stdin: %v", err)
	}
}

func TestInstallSettingsCopyATokenFile(t *testing.T) {
	h, l := userLayout(t)
	file := filepath.Join(t.TempDir(), "token")
	os.WriteFile(file, []byte("from-file\n"), 0o600)
	req, _ := parseInstall([]string{"--url", "wss://e.example.com", "--token-file", file})
	values, _, err := installSettings(context.Background(), h, l, req)
	if err != nil {
		t.Fatal(err)
	}
	if values["token"] != "from-file" || values["token-file"] != nil {
		t.Errorf("token %q, token-file %v", values["token"], values["token-file"])
	}
}

func TestInstallSettingsNeedURLAndToken(t *testing.T) {
	h, l := userLayout(t)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--token", "t"}, "--url is required"},
		{[]string{"--url", "https://e.example.com"}, "a token is required"},
		{[]string{"--url", "gopher://e.example.com", "--token", "t"}, "scheme must be"},
		{[]string{"--url", "https://e.example.com", "--token", "t", "--python", "/no/such/python"}, "/no/such/python"},
	} {
		req, _ := parseInstall(tc.args)
		_, _, err := installSettings(context.Background(), h, l, req)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v; want an error saying %q", tc.args, err, tc.says)
		}
	}
	if exists(l.ConfigPath) {
		t.Error("a refused install wrote a config")
	}
}

func TestBadValuesAreCaughtBeforeWriting(t *testing.T) {
	h, l := userLayout(t)
	req, _ := parseInstall([]string{"--url", "https://e.example.com", "--token", "t", "--parallel", "0"})
	values, _, err := installSettings(context.Background(), h, l, req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = loadConfig(values)
	if err == nil || !strings.Contains(err.Error(), "--parallel") {
		t.Errorf("parallel 0: %v", err)
	}
	var usage *config.UsageError
	if !errors.As(err, &usage) {
		t.Errorf("a bad value should be a usage error (exit 2): %T", err)
	}
}

// TestTheTokenStaysOutOfTheServiceFiles renders every service file from an
// install whose token is known and looks for it.
func TestTheTokenStaysOutOfTheServiceFiles(t *testing.T) {
	const token = "tok-3b1f9c"
	cfg, err := loadConfig(map[string]any{"url": "wss://e.example.com/api/v1/workers/attach", "token": token})
	if err != nil {
		t.Fatal(err)
	}
	for _, goos := range []string{"linux", "darwin"} {
		for _, user := range []bool{false, true} {
			l, _ := layoutFor(goos, user, dirs{Home: "/home/ada"})
			text, err := renderServiceFile(l, "/usr/bin/fluksio-worker", account{Name: "fluksio-worker"}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(text, token) {
				t.Errorf("%s: the token is in the service file:\n%s", l.Kind(), text)
			}
		}
	}
}

func TestRunAsChecksTheServiceAccount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching accounts needs root")
	}
	acct, err := lookupAccount(context.Background(), "nobody")
	if err != nil {
		t.Skip("no nobody account here")
	}
	// A directory only root may enter, like /root.
	private := filepath.Join(t.TempDir(), "private")
	os.Mkdir(private, 0o700)
	tool := filepath.Join(private, "tool")
	os.WriteFile(tool, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	if err := runAs(context.Background(), acct, tool); err == nil {
		t.Error("nobody could run a program inside a 0700 directory of root's")
	}
	sh, _ := exec.LookPath("sh")
	if err := runAs(context.Background(), acct, sh, "-c", "test \"$(id -u)\" = "+strconv.Itoa(acct.UID)); err != nil {
		t.Errorf("runAs did not run as %s: %v", acct.Name, err)
	}
}

// A URL that can never work stops the install, as a refused token does,
// and says the URL to use: wss:// to an engine without TLS, ws:// to one
// with it, or to a TLS server that does not answer HTTP (as Python's
// websockets with ssl does not). Each is a real server on loopback.
func TestInstallRefusesAURLThatCannotWork(t *testing.T) {
	t.Parallel()
	// A TLS listener and nothing over it, with httptest's certificate.
	certs := httptest.NewUnstartedServer(nil)
	certs.StartTLS()
	tlsConfig := certs.TLS.Clone()
	certs.Close()
	bare, err := tls.Listen("tcp", "127.0.0.1:0", tlsConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bare.Close() })
	go func() {
		for {
			c, err := bare.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	plain, err := enginetest.Start(enginetest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Close)
	withTLS, err := enginetest.Start(enginetest.Options{TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(withTLS.Close)
	for _, tc := range []struct{ url, use string }{
		{"wss://" + plain.Addr() + "/api/v1/workers/attach", "use ws://" + plain.Addr() + "/api/v1/workers/attach in --url"},
		{"ws://" + withTLS.Addr() + "/api/v1/workers/attach", "use wss://" + withTLS.Addr() + "/api/v1/workers/attach in --url"},
		{"ws://" + bare.Addr().String() + "/api/v1/workers/attach", "use wss://" + bare.Addr().String() + "/api/v1/workers/attach in --url"},
	} {
		cfg, err := loadConfig(map[string]any{"url": tc.url, "token": "t"})
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		err = checkEngine(context.Background(), cfg, &out, &errOut)
		var usage *config.UsageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.use) || !strings.Contains(err.Error(), "nothing was installed") {
			t.Errorf("%s: %v (stderr %q); want a usage error that says %q and that nothing was installed", tc.url, err, errOut.String(), tc.use)
		}
	}
}
