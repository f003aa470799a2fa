package installer

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/logging"
)

// reachCheckTimeout bounds each run-as-the-service-account check.
const reachCheckTimeout = 30 * time.Second

// checkLocations catches, at install and before it changes anything, a
// file the service needs under /tmp or /var/tmp, which the system unit's
// PrivateTmp= replaces with empty directories of its own, so the service
// would fail at every start (the binary, Python, --ca-file) or refuse
// every call (a key, a hook).
func checkLocations(l Layout, exe string, cfg config.Config) error {
	if !privateTmp(l) {
		return nil // the user runs it, and just did
	}
	type location struct{ what, path, fix string }
	locations := []location{
		{"this fluksio-worker binary", exe, "install it in /usr/local/bin (or install the package) and run install from there"},
		{"Python", cfg.Python, "pass --python with an interpreter outside /tmp"},
		{"--ca-file", cfg.CAFile, "move it to /etc/fluksio-worker and pass that path"},
		{"--pre-call-hook's program", hook.Program(cfg.PreCallHook), "move it to /etc/fluksio-worker (or /usr/local/bin) and pass that path"},
		{"--post-call-hook's program", hook.Program(cfg.PostCallHook), "move it to /etc/fluksio-worker (or /usr/local/bin) and pass that path"},
	}
	for _, key := range cfg.TrustKeys {
		locations = append(locations, location{"--trust-key", key, "move it to /etc/fluksio-worker and pass that path"})
	}
	for _, p := range locations {
		if p.path != "" && underTmp(p.path) {
			return fmt.Errorf("%s is at %s, and the service cannot see /tmp or /var/tmp (it gets private ones); %s", p.what, p.path, p.fix)
		}
	}
	return nil
}

// privateTmp says whether the service install writes for l sees a /tmp and
// /var/tmp of its own (PrivateTmp=yes in its unit), not the machine's.
func privateTmp(l Layout) bool {
	return l.GOOS == "linux" && !l.UserService && strings.Contains(systemUnit, "\nPrivateTmp=yes\n")
}

// checkReachable catches what would otherwise make the service fail at
// every start, or decline every call: a binary or Python the service
// account cannot run (say, under /root, which only root may enter), a hook
// it cannot run, a key or CA file it cannot read.
func checkReachable(ctx context.Context, h host, l Layout, acct account, exe string, cfg config.Config) error {
	if l.UserService || !h.root() || acct.UID == 0 {
		return nil
	}
	if err := runAs(ctx, acct, exe, "--version"); err != nil {
		return fmt.Errorf("the service account %s cannot run %s: %v; install the binary where every user can run it, e.g. /usr/local/bin", acct.Name, exe, err)
	}
	if err := runAs(ctx, acct, cfg.Python, "-c", "import sys"); err != nil {
		return fmt.Errorf("the service account %s cannot run the Python %s: %v; give it access, or pass --python with one it can run (a venv under /opt, say)", acct.Name, cfg.Python, err)
	}
	return accountCanUse(ctx, acct, cfg)
}

// accountCanUse checks, as the service account, that it may run the
// hooks' programs and read the trusted keys and the CA file: root, who
// runs install and check, may where the account may not.
func accountCanUse(ctx context.Context, acct account, cfg config.Config) error {
	type need struct{ what, path, test, fix string }
	needs := []need{
		{"--pre-call-hook's program", hook.Program(cfg.PreCallHook), "-x", "chmod +x, or chown it to the account"},
		{"--post-call-hook's program", hook.Program(cfg.PostCallHook), "-x", "chmod +x, or chown it to the account"},
		{"--ca-file", cfg.CAFile, "-r", "make it readable by the account (chmod 644 for a certificate)"},
	}
	for _, key := range cfg.TrustKeys {
		needs = append(needs, need{"--trust-key", key, "-r", "make it readable by the account (a public key may be chmod 644)"})
	}
	for _, n := range needs {
		if n.path == "" {
			continue
		}
		if err := runAs(ctx, acct, "/bin/sh", "-c", `test `+n.test+` "$1"`, "sh", n.path); err != nil {
			verb := "run"
			if n.test == "-r" {
				verb = "read"
			}
			return fmt.Errorf("the service account %s cannot %s %s %s (the file, or a directory above it, is closed to it); %s", acct.Name, verb, n.what, n.path, n.fix)
		}
	}
	return nil
}

func underTmp(path string) bool {
	for _, tmp := range []string{"/tmp", "/var/tmp"} {
		if path == tmp || strings.HasPrefix(path, tmp+"/") {
			return true
		}
	}
	if resolved, err := filepath.EvalSymlinks(path); err == nil && resolved != path {
		return underTmp(resolved)
	}
	return false
}

// runAs runs a command as the account, from /, with a bare environment: as
// close to how the service will start it as install can get without the
// service manager.
func runAs(ctx context.Context, acct account, path string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, reachCheckTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/", "LANG=C.UTF-8"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(acct.UID), Gid: uint32(acct.GID)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if msg := strings.TrimSpace(string(out)); msg != "" {
			return fmt.Errorf("%w: %s", err, logging.LastLines(msg, 2))
		}
		return err
	}
	return nil
}
