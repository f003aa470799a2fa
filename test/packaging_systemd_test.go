package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// debUnderSystemd is the deb's life on a Debian with a real systemd, as a
// user lives it: apt installs it, `install` attaches it to the engine as a
// service, apt upgrades it, removes it, purges it. The fake engine runs on
// the host; the container shares the host's loopback.
func debUnderSystemd(t *testing.T, v1, v2 release) {
	nspawn.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	step := stepTimer(t)

	m := bootMachine(ctx, t)
	step("boot")

	const token = "pkg-test-token-7f3a"
	eng := startEngine(t, enginetest.Options{Tokens: []string{token}})

	sh := machineShell(ctx, t, m)
	addGPUGroups(ctx, t, m)
	debIn := func(r release) string {
		t.Helper()
		deb := r.pkg(t, "deb", runtime.GOARCH)
		in := "/tmp/" + filepath.Base(deb)
		if err := m.CopyIn(deb, in); err != nil {
			t.Fatal(err)
		}
		return in
	}

	// Install: apt resolves python3 (already in the image, so no network),
	// the preinst creates the account, the postinst says what to do next.
	out := sh("apt-get install -y " + debIn(v1))
	if !strings.Contains(out, "sudo fluksio-worker install --url") {
		t.Errorf("a fresh install does not print the next step:\n%s", out)
	}
	passwd := strings.TrimSpace(sh("getent passwd fluksio-worker"))
	if f := strings.Split(passwd, ":"); len(f) != 7 || f[5] != "/var/lib/fluksio-worker" || !strings.HasSuffix(f[6], "nologin") {
		t.Errorf("system user: %q; want home /var/lib/fluksio-worker and no login shell", passwd)
	}
	checkGPUGroups(ctx, t, m, "fluksio-worker")
	if _, err := os.Stat(m.Path("/var/lib/fluksio-worker/.bashrc")); err == nil {
		t.Error("the system user got skeleton files")
	}
	// The manual page and the completions lie where man and each shell
	// look, and work there.
	for _, f := range shellDocs {
		if _, err := os.Stat(m.Path(f)); err != nil {
			t.Errorf("the package did not install %s: %v", f, err)
		}
	}
	if out := sh("gzip -dc /usr/share/man/man1/fluksio-worker.1.gz | head -n 5"); !strings.Contains(out, ".TH FLUKSIO") {
		t.Errorf("/usr/share/man/man1/fluksio-worker.1.gz is not the manual page:\n%s", out)
	}
	if out := sh(`bash -c 'source /usr/share/bash-completion/completions/fluksio-worker; COMP_WORDS=(fluksio-worker ins); COMP_CWORD=1; _fluksio_worker; echo "${COMPREPLY[*]}"'`); strings.TrimSpace(out) != "install" {
		t.Errorf("the installed bash completion completes 'fluksio-worker ins' to %q, want install", out)
	}
	sh("apt-get install -y --reinstall " + debIn(v1)) // maintainer scripts run twice
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v1.version {
		t.Errorf("installed version %q, want %s", got, v1.version)
	}
	step("apt-get install (fresh, then again)")

	// Attach as a service, the token from a file so it is on no command line.
	sh(fmt.Sprintf("umask 077 && printf '%%s\\n' %s > /root/token", token))
	sh(fmt.Sprintf("fluksio-worker install --url %s --token-file /root/token --labels pkgtest", eng.AttachURL()))
	if state := strings.TrimSpace(sh("systemctl is-active fluksio-worker || true")); state != "active" {
		t.Fatalf("after install the service is %q", state)
	}
	w := liveWorker(ctx, t, eng)
	if !slices.Contains(w.Hello.Labels, "pkgtest") {
		t.Errorf("hello labels %v, want pkgtest", w.Hello.Labels)
	}
	runDouble(ctx, t, w, "c1", 21)
	pid1 := mainPID(t, sh)
	config, err := os.ReadFile(m.Path("/etc/fluksio-worker/config.toml"))
	if err != nil {
		t.Fatalf("install wrote no config: %v", err)
	}
	step("install as a service, attach, run a node")

	// Upgrade with a long node running: same config, the unit refreshed,
	// the running service reloaded: the node runs to its end and is
	// answered ok, then the same process runs the new binary and attaches
	// again. apt does not wait for the node.
	const longSeconds = 25
	long := startLongNode(ctx, t, w, "long1", longSeconds)
	out = sh("apt-get install -y " + debIn(v2))
	if strings.Contains(out, "sudo fluksio-worker install --url") {
		t.Errorf("an upgrade of an installed service prints the first-install hint:\n%s", out)
	}
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v2.version {
		t.Errorf("after the upgrade: %q, want %s", got, v2.version)
	}
	if after, err := os.ReadFile(m.Path("/etc/fluksio-worker/config.toml")); err != nil || string(after) != string(config) {
		t.Errorf("the upgrade changed the config (%v):\nbefore:\n%s\nafter:\n%s", err, config, after)
	}
	if state := strings.TrimSpace(sh("systemctl is-active fluksio-worker || true")); state != "active" {
		t.Fatalf("after the upgrade the service is %q", state)
	}
	eventuallyIn(t, 5*time.Second, "status to say the reload waits for long1", func() (bool, string) {
		out, _ := m.Exec(ctx, "fluksio-worker status")
		return strings.Contains(out, "reloading") && strings.Contains(out, "waiting for long1"), out
	})
	finishLongNode(ctx, t, long, longSeconds)
	select {
	case <-w.Done():
	case <-time.After(30 * time.Second):
		t.Error("the old worker's connection is still open after its call ended")
	}
	w = liveWorker(ctx, t, eng)
	if pid2 := mainPID(t, sh); pid2 != pid1 {
		t.Errorf("the upgrade restarted the service (MainPID %s, was %s); it must reload in place", pid2, pid1)
	}
	if exe := strings.TrimSpace(sh("readlink /proc/" + pid1 + "/exe")); exe != "/usr/bin/fluksio-worker" {
		t.Errorf("after the reload the service runs %q; want the new /usr/bin/fluksio-worker", exe)
	}
	eventuallyIn(t, 10*time.Second, "status to show the new version attached", func() (bool, string) {
		out, _ := m.Exec(ctx, "fluksio-worker status")
		return strings.Contains(out, "fluksio-worker "+v2.version) && strings.Contains(out, "attached as"), out
	})
	runDouble(ctx, t, w, "c2", 50)
	step("apt-get install (upgrade) with a node running, reload")

	// A changed setting with a node running: install reloads, the node
	// finishes, and the next hello carries the new labels.
	long = startLongNode(ctx, t, w, "long2", 10)
	out = sh("fluksio-worker install --labels other </dev/null")
	if !strings.Contains(out, "Reloading the running worker") {
		t.Errorf("install of a changed setting did not reload:\n%s", out)
	}
	finishLongNode(ctx, t, long, 10)
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	if !slices.Equal(w.Hello.Labels, []string{"other"}) {
		t.Errorf("after install --labels other the hello has labels %v", w.Hello.Labels)
	}
	if pid := mainPID(t, sh); pid != pid1 {
		t.Errorf("install restarted the service (MainPID %s, was %s); it must reload", pid, pid1)
	}
	runDouble(ctx, t, w, "c3", 8)
	step("install --labels with a node running, reload")

	// A stopped service stays stopped through an upgrade (here: a reinstall
	// of the same version, which runs the same postinst).
	sh("systemctl stop fluksio-worker")
	sh("apt-get install -y --reinstall " + debIn(v2))
	if state := strings.TrimSpace(sh("systemctl is-active fluksio-worker || true")); state != "inactive" {
		t.Errorf("a stopped service is %q after a package upgrade; the postinst must only reload a running one", state)
	}
	sh("systemctl start fluksio-worker")
	step("reinstall with the service stopped")

	// rpm passes counts where dpkg passes verbs: %preun gets 1 on an upgrade
	// (the new version's scripts have already run), 0 on an erase. Run the
	// script as rpm would, here where a service is installed to lose.
	if err := m.CopyIn(filepath.Join(moduleRoot(t), "packaging/scripts/preremove.sh"), "/root/preremove.sh"); err != nil {
		t.Fatal(err)
	}
	sh("sh /root/preremove.sh 1 && sh /root/preremove.sh upgrade")
	if state := strings.TrimSpace(sh("systemctl is-active fluksio-worker || true")); state != "active" {
		t.Errorf("preremove as an upgrade (1 or upgrade) stopped the service: %q", state)
	}
	step("preremove with rpm's upgrade argument")

	// Remove: the service stops and its unit goes; config and state stay.
	out = sh("apt-get remove -y fluksio-worker 2>&1")
	// What is said about the config kept must work once the binary is gone.
	if !strings.Contains(out, "'apt purge fluksio-worker' removes them") || strings.Contains(out, "fluksio-worker uninstall --purge") {
		t.Errorf("apt-get remove does not point at apt purge for the config it keeps (or names the removed binary):\n%s", out)
	}
	if state := strings.TrimSpace(sh("systemctl is-active fluksio-worker || true")); state == "active" {
		t.Error("apt-get remove left the service running")
	}
	for _, gone := range append([]string{"/usr/bin/fluksio-worker", "/etc/systemd/system/fluksio-worker.service"}, shellDocs...) {
		if _, err := os.Lstat(m.Path(gone)); err == nil {
			t.Errorf("apt-get remove left %s", gone)
		}
	}
	if out := sh("systemctl list-unit-files fluksio-worker.service --no-legend || true"); strings.TrimSpace(out) != "" {
		t.Errorf("systemd still knows the unit after remove: %s", out)
	}
	if _, err := os.Stat(m.Path("/etc/fluksio-worker/config.toml")); err != nil {
		t.Errorf("apt-get remove deleted the config: %v", err)
	}
	step("apt-get remove")

	// Purge: config and state go too.
	sh("apt-get purge -y fluksio-worker")
	for _, gone := range []string{"/etc/fluksio-worker", "/var/lib/fluksio-worker", "/etc/systemd/system/fluksio-worker.service"} {
		if _, err := os.Lstat(m.Path(gone)); err == nil {
			t.Errorf("apt-get purge left %s", gone)
		}
	}
	if out := sh("dpkg -l fluksio-worker 2>/dev/null | grep '^[a-z][a-z] ' || true"); strings.TrimSpace(out) != "" {
		t.Errorf("dpkg still lists the package after purge: %s", out)
	}
	step("apt-get purge")
}

// shellDocs are where the deb puts the manual page and the completions:
// where man-db, bash-completion, Debian's zsh and fish look for them.
var shellDocs = []string{
	"/usr/share/man/man1/fluksio-worker.1.gz",
	"/usr/share/bash-completion/completions/fluksio-worker",
	"/usr/share/zsh/vendor-completions/_fluksio-worker",
	"/usr/share/fish/vendor_completions.d/fluksio-worker.fish",
}
