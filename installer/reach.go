package installer

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

// reachCheckTimeout bounds each run-as-the-service-account check.
const reachCheckTimeout = 30 * time.Second

// checkLocations catches, at install and before it changes anything, a
// binary or Python under /tmp, which the system unit's PrivateTmp=
// replaces with an empty directory, so the service would fail at every
// start.
func checkLocations(l Layout, exe, python string) error {
	if l.UserService || l.GOOS != "linux" {
		return nil // the user runs it, and just did
	}
	for _, p := range []struct{ what, path, fix string }{
		{"this fluksio-worker binary", exe, "install it in /usr/local/bin (or install the package) and run install from there"},
		{"Python", python, "pass --python with an interpreter outside /tmp"},
	} {
		if underTmp(p.path) {
			return fmt.Errorf("%s is at %s, and the service cannot see /tmp (it gets a private one); %s", p.what, p.path, p.fix)
		}
	}
	return nil
}

// checkReachable catches what would otherwise make the service fail at
// every start: a binary or Python the service account cannot run (say,
// under /root, which only root may enter).
func checkReachable(ctx context.Context, h host, l Layout, acct account, exe, python string) error {
	if l.UserService || !h.root() || acct.UID == 0 {
		return nil
	}
	if err := runAs(ctx, acct, exe, "--version"); err != nil {
		return fmt.Errorf("the service account %s cannot run %s: %v; install the binary where every user can run it, e.g. /usr/local/bin", acct.Name, exe, err)
	}
	if err := runAs(ctx, acct, python, "-c", "import sys"); err != nil {
		return fmt.Errorf("the service account %s cannot run the Python %s: %v; give it access, or pass --python with one it can run (a venv under /opt, say)", acct.Name, python, err)
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
