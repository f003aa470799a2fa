package test

// Which repository key a machine accepts: install.sh trusts the release key
// alone, by the fingerprint written in it, never replaces an installed key
// unless told to, and repository.sh signs with no other key.

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// TestReleaseKeyFingerprintPublished: the fingerprint install.sh trusts is
// the one README.md and docs/releasing.md publish, so that a person can
// compare the key before trusting it.
func TestReleaseKeyFingerprintPublished(t *testing.T) {
	root := moduleRoot(t)
	script, err := os.ReadFile(filepath.Join(root, "packaging/install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := releaseKeyLine.FindAllSubmatch(script, -1)
	if len(m) != 1 {
		t.Fatalf("packaging/install.sh has %d release_key=FINGERPRINT lines (40 upper-case hex digits), want 1", len(m))
	}
	fingerprint := string(m[0][1])
	for _, doc := range []string{"README.md", "docs/releasing.md"} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), fingerprint) {
			t.Errorf("%s does not publish the release key's fingerprint %s (install.sh's release_key=)", doc, fingerprint)
		}
	}
}

// TestRepositoryRefusesAKeyInstallShDoesNotTrust: repository.sh signs only
// with the key the install.sh it publishes trusts; with another it stops
// before writing anything, saying what to change.
func TestRepositoryRefusesAKeyInstallShDoesNotTrust(t *testing.T) {
	key := newSigningKey(t)
	dist := t.TempDir()
	if err := os.WriteFile(filepath.Join(dist, "fluksio-worker_1.0.0-1_amd64.deb"), []byte("a package"), 0o644); err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(t.TempDir(), "repo")
	// packaging/ itself: its install.sh trusts the release key, not this one.
	cmd := exec.Command("sh", filepath.Join(key.root, "packaging/repository.sh"), dist, repo)
	cmd.Env = append(os.Environ(), "GNUPGHOME="+key.home, "FLUKSIO_SIGNING_KEY="+key.fingerprint)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "trusts only") || !strings.Contains(string(out), key.fingerprint) {
		t.Errorf("repository.sh signing with a key install.sh does not trust: %v\n%s\nwant a refusal naming the key", err, out)
	}
	if _, err := os.Stat(repo); !os.IsNotExist(err) {
		t.Errorf("repository.sh refused, yet wrote %s (%v)", repo, err)
	}
}

// TestInstallScriptTrustsOnlyTheReleaseKeyUnderSystemd: on a Debian with a
// real systemd, install.sh against a repository signed with a key other
// than the release key: refused on a fresh machine, and on one already
// installed from the real repository, whether the install.sh run trusts
// the release key or (as one served by whoever controls the server would)
// the other key; nothing is written, the installed key stays. Then a
// planned rotation to a new release key, named by FLUKSIO_ROTATE_KEY:
// the key is replaced and apt installs from the repository it signs.
func TestInstallScriptTrustsOnlyTheReleaseKeyUnderSystemd(t *testing.T) {
	nspawn.Require(t)
	v1 := sharedSnapshot(t, "1.0.0")
	v2 := sharedSnapshot(t, "1.0.1")
	release := newSigningKey(t) // the release key install.sh trusts
	other := newSigningKey(t)   // another's key, then the next release key
	repos := t.TempDir()
	release.publish(t, v1.dist, filepath.Join(repos, "release"))
	other.publish(t, v2.dist, filepath.Join(repos, "other"))
	srv := httptest.NewServer(http.FileServer(http.Dir(repos)))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	step := stepTimer(t)
	m := bootMachine(ctx, t)
	sh := machineShell(ctx, t, m)
	step("boot")
	sh("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*")
	// Each repository's own install.sh: the one published with the release
	// key trusts it; the other's trusts the other key.
	for _, name := range []string{"release", "other"} {
		if err := m.CopyIn(filepath.Join(repos, name, "install.sh"), "/root/install-"+name+".sh"); err != nil {
			t.Fatal(err)
		}
	}
	// installSh runs script (release or other) against repository repo as
	// `curl URL/install.sh | sh` does, with env (VAR=value ...) before it.
	installSh := func(script, repo, env string) (string, error) {
		return m.Exec(ctx, env+" FLUKSIO_REPO_URL="+srv.URL+"/"+repo+" sh </root/install-"+script+".sh 2>&1")
	}
	const (
		keyPath  = "/etc/apt/keyrings/fluksio-worker.asc"
		listPath = "/etc/apt/sources.list.d/fluksio-worker.list"
	)
	files := func() string {
		return sh("sha256sum " + keyPath + " " + listPath + " 2>&1; dpkg-query -W fluksio-worker 2>&1 || true")
	}
	refused := func(what, out string, err error, wants ...string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: install.sh succeeded:\n%s", what, out)
			return
		}
		for _, want := range append(wants, "Nothing was changed") {
			if !strings.Contains(out, want) {
				t.Errorf("%s: install.sh says:\n%s\nwant it to say %q", what, out, want)
			}
		}
	}

	// A fresh machine, a repository signed with another key.
	fresh := files()
	out, err := installSh("release", "other", "")
	refused("fresh machine, another key", out, err, "is not the fluksio-worker release key", other.fingerprint, release.fingerprint)
	// Naming the key as a rotation does not make install.sh trust it.
	out, err = installSh("release", "other", "FLUKSIO_ROTATE_KEY="+other.fingerprint)
	refused("fresh machine, another key named by FLUKSIO_ROTATE_KEY", out, err, "is not the fluksio-worker release key")
	if now := files(); now != fresh {
		t.Errorf("install.sh refused, yet changed the machine:\nbefore:\n%s\nafter:\n%s", fresh, now)
	}
	step("fresh machine: another key refused")

	// From the release key's repository: installed, the key and its
	// fingerprint said.
	out, err = installSh("release", "release", "")
	if err != nil {
		t.Fatalf("install.sh from the release key's repository: %v\n%s", err, out)
	}
	if !strings.Contains(out, "release key, "+release.fingerprint) {
		t.Errorf("install.sh does not say which key it trusted:\n%s", out)
	}
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v1.version {
		t.Fatalf("install.sh installed %q, want %s", got, v1.version)
	}
	releaseKey, _ := os.ReadFile(filepath.Join(repos, "release/fluksio-worker.asc"))
	installed := files()
	step("install.sh from the release key's repository")

	// Run again against the other key's repository: with the script that
	// trusts the release key, and with the one that trusts the other key
	// (as whoever serves the other repository would serve).
	out, err = installSh("release", "other", "")
	refused("installed machine, another key", out, err, "is not the fluksio-worker release key")
	out, err = installSh("other", "other", "")
	refused("installed machine, another key and an install.sh trusting it", out, err,
		"holds another key than the repository's", "FLUKSIO_ROTATE_KEY="+other.fingerprint)
	out, err = installSh("other", "other", "FLUKSIO_ROTATE_KEY="+release.fingerprint)
	refused("FLUKSIO_ROTATE_KEY naming a key the repository does not serve", out, err, "FLUKSIO_ROTATE_KEY is "+release.fingerprint)
	if now := files(); now != installed {
		t.Errorf("install.sh refused, yet changed the machine:\nbefore:\n%s\nafter:\n%s", installed, now)
	}
	if b, err := os.ReadFile(m.Path(keyPath)); err != nil || !bytes.Equal(b, releaseKey) {
		t.Errorf("%s is no longer the release key (%v)", keyPath, err)
	}
	step("installed machine: another key refused")

	// A planned rotation: the other key is the new release key, its
	// install.sh trusts it, and the operator names it.
	out, err = installSh("other", "other", "FLUKSIO_ROTATE_KEY="+other.fingerprint)
	if err != nil {
		t.Fatalf("install.sh with FLUKSIO_ROTATE_KEY=the new key: %v\n%s", err, out)
	}
	if !strings.Contains(out, "replacing the key "+release.fingerprint) {
		t.Errorf("install.sh does not say it replaced the key:\n%s", out)
	}
	otherKey, _ := os.ReadFile(filepath.Join(repos, "other/fluksio-worker.asc"))
	if b, err := os.ReadFile(m.Path(keyPath)); err != nil || !bytes.Equal(b, otherKey) {
		t.Errorf("after the rotation %s is not the new key (%v)", keyPath, err)
	}
	// apt took the newer release from the repository the new key signs.
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v2.version {
		t.Errorf("after the rotation: %q, want %s", got, v2.version)
	}
	// And after it the new key is simply the installed one.
	if out, err := installSh("other", "other", ""); err != nil || !strings.Contains(out, "already set up") {
		t.Errorf("install.sh after the rotation: %v\n%s", err, out)
	}
	step("planned rotation")
}
