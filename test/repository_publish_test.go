package test

// Publishing a release (packaging/publish.sh) adds it to the served
// repository: every version published before stays listed and installable.

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// TestPublishKeepsEveryVersionUnderSystemd publishes 1.0.0 (the first
// release), then 1.0.1, into a served tree as docs/releasing.md does: the
// indexes list both, for each architecture, apt's and dnf's; 1.0.0 rebuilt
// is refused and the tree stays as it was. Then, on a Debian with a real
// systemd, apt installs 1.0.0 by version and upgrades it to 1.0.1.
func TestPublishKeepsEveryVersionUnderSystemd(t *testing.T) {
	nspawn.Require(t)
	needTool(t, "rsync")
	v1 := sharedSnapshot(t, "1.0.0")
	v2 := sharedSnapshot(t, "1.0.1")
	key := newSigningKey(t)
	served := filepath.Join(t.TempDir(), "served")
	publish := func(args ...string) (string, error) { return key.script(key.root, "publish.sh", args...) }

	if out, err := publish(v1.dist, served); err == nil || !strings.Contains(out, "--first") {
		t.Errorf("publish.sh into a tree with no repository, without --first: %v\n%s\nwant a refusal", err, out)
	}
	for _, args := range [][]string{{"--first", v1.dist, served}, {v2.dist, served}} {
		if out, err := publish(args...); err != nil {
			t.Fatalf("publish.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, arch := range []string{"amd64", "arm64"} {
		b, _ := os.ReadFile(filepath.Join(served, "deb/dists/stable/main/binary-"+arch+"/Packages"))
		for _, v := range []string{"1.0.0-1", "1.0.1-1"} {
			if !strings.Contains(string(b), "\nVersion: "+v+"\n") {
				t.Errorf("binary-%s/Packages does not list %s:\n%s", arch, v, b)
			}
		}
	}
	primary := rpmPrimary(t, served)
	for _, rpm := range []string{"fluksio-worker-1.0.0-1.x86_64.rpm", "fluksio-worker-1.0.0-1.aarch64.rpm", "fluksio-worker-1.0.1-1.x86_64.rpm", "fluksio-worker-1.0.1-1.aarch64.rpm"} {
		if !strings.Contains(primary, `href="packages/`+rpm+`"`) {
			t.Errorf("the rpm metadata does not list %s:\n%s", rpm, primary)
		}
	}

	// 1.0.0 rebuilt: refused, and nothing uploaded.
	before := treeSums(t, served)
	rebuilt := t.TempDir()
	deb, err := os.ReadFile(v1.pkg(t, "deb", "amd64"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rebuilt, "fluksio-worker_1.0.0-1_amd64.deb"), append(deb, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := publish(rebuilt, served); err == nil || !strings.Contains(out, "already published with other contents") {
		t.Errorf("publish.sh of a rebuilt 1.0.0: %v\n%s\nwant a refusal", err, out)
	}
	if after := treeSums(t, served); after != before {
		t.Errorf("a refused publish.sh changed the served tree:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	srv := httptest.NewServer(http.FileServer(http.Dir(served)))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	step := stepTimer(t)
	m := bootMachine(ctx, t)
	sh := machineShell(ctx, t, m)
	step("boot")
	// The source as docs/releasing.md sets it up by hand; the test machine
	// has no other.
	sh("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*")
	if err := m.CopyIn(filepath.Join(served, "fluksio-worker.asc"), "/etc/apt/keyrings/fluksio-worker.asc"); err != nil {
		t.Fatal(err)
	}
	sh("echo 'deb [signed-by=/etc/apt/keyrings/fluksio-worker.asc] " + srv.URL + "/deb stable main' >/etc/apt/sources.list.d/fluksio-worker.list && apt-get update -q")
	sh("apt-get install -y -q fluksio-worker=1.0.0-1 </dev/null")
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v1.version {
		t.Errorf("apt-get install fluksio-worker=1.0.0-1 installed %q", got)
	}
	step("apt-get install fluksio-worker=1.0.0-1")
	sh("apt-get upgrade -y -q </dev/null")
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v2.version {
		t.Errorf("after apt-get upgrade: %q, want %s", got, v2.version)
	}
	step("apt-get upgrade to 1.0.1")
}

// rpmPrimary is the primary metadata (every package, its location) of the
// rpm repository in tree, as dnf reads it from the file repomd.xml names.
func rpmPrimary(t *testing.T, tree string) string {
	t.Helper()
	repomd, err := os.ReadFile(filepath.Join(tree, "rpm/repodata/repomd.xml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)<data type="primary">.*?<location href="([^"]+\.gz)"`).FindSubmatch(repomd)
	if m == nil {
		t.Fatalf("repomd.xml names no gzip'ed primary metadata:\n%s", repomd)
	}
	f, err := os.Open(filepath.Join(tree, "rpm", string(m[1])))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
