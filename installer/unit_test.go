package installer

import (
	"bytes"
	"encoding/xml"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run 'go test ./installer -run %s -update' to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from what is rendered now (if the change is meant, rerun with -update):\n--- got\n%s", path, got)
	}
}

var systemParams = serviceParams{
	Executable:  "/usr/bin/fluksio-worker",
	ConfigPath:  "/etc/fluksio-worker/config.toml",
	Account:     "fluksio-worker",
	CancelGrace: 3 * time.Second,
}

func TestSystemUnitGolden(t *testing.T) {
	unit, err := renderUnit(systemParams, false)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "fluksio-worker.service", unit)
	for _, line := range []string{
		"ExecStart=/usr/bin/fluksio-worker run --config /etc/fluksio-worker/config.toml",
		"User=fluksio-worker", "Restart=on-failure", "RestartSec=5", "RestartPreventExitStatus=1 2",
		"KillMode=mixed", "TimeoutStopSec=33", "StateDirectory=fluksio-worker",
		"After=network-online.target", "Wants=network-online.target",
		"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=read-only",
		"ProtectKernelTunables=yes", "WantedBy=multi-user.target",
		"OOMScoreAdjust=-500", "Delegate=yes",
	} {
		if !hasLine(unit, line) {
			t.Errorf("the unit lacks %q", line)
		}
	}
	// Each of these closes /dev to the service, and the GPUs live there.
	for _, key := range []string{"PrivateDevices=", "DevicePolicy=", "DeviceAllow=", "ProtectClock=", "PrivateUsers="} {
		if strings.Contains(unit, "\n"+key) {
			t.Errorf("the unit sets %s, which hides GPUs from node code", key)
		}
	}
}

func TestUserUnitGolden(t *testing.T) {
	p := systemParams
	p.Account = ""
	p.ConfigPath = "/home/ada/.config/fluksio-worker/config.toml"
	unit, err := renderUnit(p, true)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "fluksio-worker-user.service", unit)
	if strings.Contains(unit, "User=") || strings.Contains(unit, "multi-user.target") {
		t.Error("a user unit must not name a user or the system's multi-user.target")
	}
}

func TestStopTimeoutCoversTheCancelGrace(t *testing.T) {
	p := systemParams
	p.CancelGrace = 90 * time.Second
	unit, _ := renderUnit(p, false)
	if !hasLine(unit, "TimeoutStopSec=120") {
		t.Errorf("a 90 s cancel grace should give TimeoutStopSec=120:\n%s", unit)
	}
}

func TestUnitQuotesAwkwardPaths(t *testing.T) {
	p := systemParams
	p.Executable = "/opt/my tools/fluksio-worker"
	p.ConfigPath = "/etc/fluksio 100%/$HOME/config.toml"
	unit, err := renderUnit(p, false)
	if err != nil {
		t.Fatal(err)
	}
	want := `ExecStart="/opt/my tools/fluksio-worker" run --config "/etc/fluksio 100%%/$$HOME/config.toml"`
	if !hasLine(unit, want) {
		t.Errorf("want %s in\n%s", want, unit)
	}
	for _, bad := range []string{"/usr/bin/x\nExecStartPre=/bin/rm", "/opt/{{Name}}/fluksio-worker"} {
		p.Executable = bad
		if _, err := renderUnit(p, false); err == nil {
			t.Errorf("renderUnit accepted the path %q", bad)
		}
	}
}

// TestUnitVerifies runs systemd's own checker on the unit, with awkward
// paths, where systemd-analyze is installed.
func TestUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "my tools", "fluksio-worker")
	os.MkdirAll(filepath.Dir(exe), 0o755)
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, userService := range []bool{false, true} {
		p := systemParams
		p.Executable = exe
		p.ConfigPath = filepath.Join(dir, "100% config", "config.toml")
		if userService {
			p.Account = ""
		}
		unit, err := renderUnit(p, userService)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "fluksio-worker.service")
		if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"verify", "--man=no"}
		if userService {
			args = append(args, "--user")
		}
		out, err := exec.Command(analyze, append(args, path)...).CombinedOutput()
		// verify also reports problems in unrelated units of this machine
		// (and --user ones where no user instance runs); only ours count.
		var ours []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "fluksio-worker") {
				ours = append(ours, line)
			}
		}
		if len(ours) > 0 {
			t.Errorf("systemd-analyze verify (user=%v): %v\n%s", userService, err, strings.Join(ours, "\n"))
		}
	}
}

// TestUnitSecurityExposure prints systemd's own score of the unit's
// hardening (lower is better) where systemd-analyze can rate a unit file
// offline (systemd 252 and later), and fails if a change makes it worse.
func TestUnitSecurityExposure(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	unit, _ := renderUnit(systemParams, false)
	dir := t.TempDir()
	path := filepath.Join(dir, "fluksio-worker.service")
	os.WriteFile(path, []byte(unit), 0o644)
	out, _ := exec.Command(analyze, "security", "--offline=true", "--no-pager", path).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for fluksio-worker.service: ([0-9.]+) (\S+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Skipf("this systemd-analyze cannot rate a unit file offline:\n%s", logging.LastLines(string(out), 5))
	}
	t.Logf("systemd-analyze security: exposure %s %s", m[1], m[2])
	if exposure, _ := strconv.ParseFloat(m[1], 64); exposure > maxExposure {
		t.Errorf("exposure %s is worse than %.1f; harden the unit or raise maxExposure with a reason", m[1], maxExposure)
	}
}

// maxExposure is the unit's systemd-analyze security score (systemd 252)
// when it was last reviewed. Most of what is left would close /dev (the
// GPUs), the network, or system calls arbitrary node code may need; 0.2 of
// it is Delegate=yes without ProtectControlGroups, which a cgroup per call
// needs (a writable cgroup of the worker's own), and 0.6 the user, mount
// and PID namespaces and mounts each call's sandbox is made of (2.5
// before; unit.go says why the trade is worth it).
const maxExposure = 3.1

func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

func TestPlistGolden(t *testing.T) {
	daemon := serviceParams{
		Executable:  "/usr/local/bin/fluksio-worker",
		ConfigPath:  "/Library/Application Support/fluksio-worker/config.toml",
		Account:     "ada",
		CancelGrace: 3 * time.Second,
	}
	plist, err := renderPlist(daemon, "/Library/Logs/fluksio-worker")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "io.fluksio.worker.plist", plist)
	checkPlist(t, plist, map[string]string{
		"Label": "io.fluksio.worker", "UserName": "ada", "RunAtLoad": "true",
		"StandardErrorPath": "/Library/Logs/fluksio-worker/fluksio-worker.log", "ExitTimeOut": "33",
		"ProgramArguments": "/usr/local/bin/fluksio-worker run --config /Library/Application Support/fluksio-worker/config.toml",
	})

	agent := daemon
	agent.Account = ""
	agent.ConfigPath = "/Users/ada/Library/Application Support/fluksio-worker/config.toml"
	plist, err = renderPlist(agent, "/Users/ada/Library/Logs/fluksio-worker")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "io.fluksio.worker-agent.plist", plist)
	checkPlist(t, plist, map[string]string{"UserName": ""})
}

func TestPlistEscapes(t *testing.T) {
	p := serviceParams{Executable: "/Applications/R&D <tools>/fluksio-worker", ConfigPath: "/c.toml", Account: "ada"}
	plist, err := renderPlist(p, "/logs")
	if err != nil {
		t.Fatal(err)
	}
	checkPlist(t, plist, map[string]string{"ProgramArguments": "/Applications/R&D <tools>/fluksio-worker run --config /c.toml"})
}

// checkPlist parses the plist as XML and compares the top-level keys in
// want: strings and integers by value, booleans as "true"/"false", arrays
// as their strings joined by spaces, "" for a key that must be absent.
func checkPlist(t *testing.T, plist string, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	dec := xml.NewDecoder(strings.NewReader(plist))
	dec.Strict = true
	var path []string
	var key string
	var text bytes.Buffer
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the plist is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			path = append(path, tok.Name.Local)
			text.Reset()
			if len(path) == 3 && (tok.Name.Local == "true" || tok.Name.Local == "false") {
				got[key] = tok.Name.Local
			}
		case xml.CharData:
			text.Write(tok)
		case xml.EndElement:
			depth := len(path)
			path = path[:depth-1]
			switch {
			case depth == 3 && tok.Name.Local == "key":
				key = text.String()
			case depth == 3 && (tok.Name.Local == "string" || tok.Name.Local == "integer"):
				got[key] = text.String()
			case depth == 4 && tok.Name.Local == "string" && path[2] == "array":
				got[key] = strings.TrimSpace(got[key] + " " + text.String())
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("plist %s = %q, want %q", k, got[k], v)
		}
	}
}

// A service running as a person's account may write its home (node code
// keeps caches there); the system account's home needs no exemption.
func TestUnitKeepsAPersonsHomeWritable(t *testing.T) {
	p := systemParams
	p.Account, p.WritableHome = "alice", "/home/alice"
	unit, err := renderUnit(p, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(unit, "ProtectHome=read-only\n") || !strings.Contains(unit, "\nReadWritePaths=-/home/alice\n") {
		t.Errorf("unit for alice:\n%s", unit)
	}
	if plain, _ := renderUnit(systemParams, false); strings.Contains(plain, "ReadWritePaths") {
		t.Errorf("the system account's unit exempts a home:\n%s", plain)
	}
	if path, err := exec.LookPath("systemd-analyze"); err == nil {
		file := filepath.Join(t.TempDir(), "fluksio-worker.service")
		os.WriteFile(file, []byte(strings.ReplaceAll(unit, "/usr/bin/fluksio-worker", "/bin/true")), 0o644)
		// verify exits 0 even on a key it does not know (it says
		// "Unknown key …, ignoring"), so what it says about this file is
		// the verdict, not its exit status.
		out, err := exec.Command(path, "verify", "--man=no", file).CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, file) {
				t.Errorf("systemd-analyze verify (%v): %s", err, line)
			}
		}
	}
}
