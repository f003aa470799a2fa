// Package nspawn boots a throwaway Debian bookworm with a real systemd, for
// tests that must see what a user's machine does: a deb installed by apt, a
// unit started by systemd, a service that survives a restart.
//
// Rootfs builds the Debian tree once (debootstrap, about 80 s) and caches it;
// Boot starts a fresh copy of it under systemd-nspawn each time, so no test
// leaks state into the cache or into another test. The container shares the
// host's network, so a server a test listens with on 127.0.0.1 is reachable
// from inside at the same address.
//
//	nspawn.Require(t)
//	m, err := nspawn.Boot(ctx, nspawn.Options{})
//	if err != nil { t.Fatal(err) }
//	defer m.Close()
//	if err := m.CopyIn("dist/fluksio-worker.deb", "/tmp/fluksio-worker.deb"); err != nil { ... }
//	out, err := m.Exec(ctx, "apt-get install -y /tmp/fluksio-worker.deb")
//
// m.Console() holds the container's boot console, for a failed test's log.
//
// It needs root, debootstrap and systemd-nspawn (Debian: apt-get install
// debootstrap systemd-container). Require skips a test where they are
// missing, except in CI (env CI set), where a missing tool is a failure.
package nspawn

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// Available says why this machine cannot boot containers, or nil if it can.
func Available() error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("systemd-nspawn needs linux, this is %s", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		return errors.New("booting a container needs root (run the tests with sudo)")
	}
	var missing []string
	for _, tool := range []string{"debootstrap", "systemd-nspawn", "nsenter", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (Debian: apt-get install debootstrap systemd-container)", strings.Join(missing, ", "))
	}
	return nil
}

// Require skips the test with -short, or when containers cannot be booted
// here, with the reason. Under CI (env CI set) the tools are installed on
// purpose, so their absence fails the test instead of silently proving
// nothing.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a systemd machine; not with -short")
	}
	err := Available()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("nspawn unavailable in CI: %v", err)
	}
	t.Skipf("nspawn unavailable: %v", err)
}
