package installer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/platform"
)

// refreshUnit is `install --refresh-unit`, which the package's postinst
// runs after an upgrade: re-render the unit or plist from this binary's
// template, keeping the account it runs as and the config it reads. It
// writes the file and nothing else; the caller reloads and try-restarts. It
// works without a running service manager (a chroot building an image), so
// it writes the file itself rather than through kardianos.
func refreshUnit(_ context.Context, h host, l Layout, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "fluksio-worker install --refresh-unit: %v\n", err)
		return config.ExitFailed
	}
	old, err := os.ReadFile(l.UnitPath)
	if errors.Is(err, os.ErrNotExist) {
		return fail(fmt.Errorf("no service is installed (no %s); run a plain install", l.UnitPath))
	}
	if err != nil {
		return fail(err)
	}
	acct := account{Name: unitAccount(string(old))}
	if !l.UserService && acct.Name == "" {
		return fail(fmt.Errorf("%s names no account to run as; run a plain install to rewrite it", l.UnitPath))
	}
	exe, err := executable(h)
	if err != nil {
		return fail(err)
	}
	// The cancel grace shapes the stop timeout; a config that no longer
	// loads keeps the default and is for `run` to report.
	cfg := config.DefaultConfig()
	if values, err := config.ReadFile(l.ConfigPath); err == nil {
		if c, err := loadConfig(values); err == nil {
			cfg = c
		}
	}
	text, err := renderServiceFile(l, exe, acct, cfg)
	if err != nil {
		return fail(err)
	}
	if text == string(old) {
		fmt.Fprintf(stdout, "%s is up to date.\n", l.UnitPath)
		return config.ExitOK
	}
	if err := platform.WriteFileAtomic(l.UnitPath, []byte(text), 0o644, platform.KeepOwner); err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "Rewrote %s; reload the service manager and restart the worker to use it.\n", l.UnitPath)
	return config.ExitOK
}

// unitAccount reads the account a service file runs as: User= in a systemd
// unit, UserName in a launchd plist; "" if none.
func unitAccount(text string) string {
	sc := bufio.NewScanner(strings.NewReader(text))
	userNameNext := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "User="); ok {
			return v
		}
		if userNameNext {
			v := strings.TrimSuffix(strings.TrimPrefix(line, "<string>"), "</string>")
			return strings.NewReplacer("&lt;", "<", "&gt;", ">", "&quot;", `"`, "&apos;", "'", "&amp;", "&").Replace(v)
		}
		userNameNext = line == "<key>UserName</key>"
	}
	return ""
}
