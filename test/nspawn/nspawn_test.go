package nspawn

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBoot boots the rootfs, checks systemd and Python inside, and that what
// a test writes in a container stays out of the cached rootfs, and that
// Close leaves nothing behind.
func TestBoot(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	start := time.Now()
	root, err := Rootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rootfs %s ready in %v", root, time.Since(start).Round(time.Millisecond))
	if st, err := os.Stat(root); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("rootfs %s: want mode 0755 (dbus needs it), got %v %v", root, st.Mode(), err)
	}

	start = time.Now()
	m, err := Boot(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t.Logf("booted %s in %v", m.Name, time.Since(start).Round(time.Millisecond))

	// A cgroup of its own, in every hierarchy systemd tracks processes by:
	// machines booted at once never share one.
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", m.init))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if (strings.HasPrefix(line, "0::") || strings.Contains(line, ":name=systemd:")) && !strings.Contains(line, "/fluksio-nspawn-"+m.Name+"/") {
			t.Errorf("the machine's init is in %s, not in a cgroup of the machine's own", line)
		}
	}
	if len(m.cgroups) == 0 {
		t.Error("the machine has no cgroup of its own")
	}

	out, err := m.Exec(ctx, "systemctl is-system-running")
	if state := strings.TrimSpace(out); state != "running" && state != "degraded" {
		t.Errorf("systemctl is-system-running = %q (%v)", state, err)
	}
	if strings.Contains(out, "degraded") {
		failed, _ := m.Exec(ctx, "systemctl --failed --no-legend")
		t.Logf("degraded; failed units:\n%s", failed)
	}
	if out, err := m.Exec(ctx, "python3 --version"); err != nil || !strings.HasPrefix(out, "Python 3.") {
		t.Errorf("python3 --version = %q, %v", out, err)
	}
	if out, err := m.Exec(ctx, "hostname"); err != nil || strings.TrimSpace(out) != m.Name {
		t.Errorf("hostname = %q, %v; want %s", out, err, m.Name)
	}
	if _, err := m.Exec(ctx, "exit 3"); err == nil {
		t.Error("Exec of a failing script: no error")
	}

	// CopyIn, then prove the file is inside and not in the shared cache.
	host := filepath.Join(t.TempDir(), "hello.sh")
	if err := os.WriteFile(host, []byte("#!/bin/sh\necho hello from $(hostname)\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"/opt/test/hello.sh", "/tmp/hello.sh"} { // /tmp is a tmpfs inside
		if err := m.CopyIn(host, dst); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := m.Exec(ctx, "/opt/test/hello.sh && /tmp/hello.sh"); err != nil || out != "hello from "+m.Name+"\nhello from "+m.Name+"\n" {
		t.Errorf("copied script: %q, %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(root, "opt/test/hello.sh")); err == nil {
		t.Error("a file copied into the container leaked into the cached rootfs")
	}

	start = time.Now()
	if err := m.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	t.Logf("powered off in %v", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(m.work); err == nil {
		t.Errorf("Close left the container's copy in %s", m.work)
	}
	for _, dir := range m.cgroups {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("Close left the machine's cgroup %s", dir)
		}
	}
}
