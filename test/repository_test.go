package test

// The signed package repositories a release publishes
// (packaging/repository.sh) and the script that installs from them
// (packaging/install.sh), as an operator meets them.

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// TestRepositoryFromRelease publishes a release into the apt and dnf
// repositories with a throwaway key: the layout apt and dnf expect, each
// index signed, the public key beside them; publishing the same release
// again changes nothing, and a package rebuilt under a published version
// is refused.
func TestRepositoryFromRelease(t *testing.T) {
	v1 := sharedSnapshot(t, "1.0.0")
	key := newSigningKey(t)
	repo := filepath.Join(t.TempDir(), "repo")
	key.publish(t, v1.dist, repo)

	for _, f := range []string{
		"fluksio-worker.asc", "install.sh",
		"deb/dists/stable/Release", "deb/dists/stable/InRelease", "deb/dists/stable/Release.gpg",
		"deb/dists/stable/main/binary-amd64/Packages", "deb/dists/stable/main/binary-arm64/Packages.gz",
		"deb/pool/main/f/fluksio-worker/fluksio-worker_1.0.0-1_amd64.deb",
		"deb/pool/main/f/fluksio-worker/fluksio-worker_1.0.0-1_arm64.deb",
		"rpm/repodata/repomd.xml", "rpm/repodata/repomd.xml.asc",
		"rpm/packages/fluksio-worker-1.0.0-1.x86_64.rpm", "rpm/packages/fluksio-worker-1.0.0-1.aarch64.rpm",
	} {
		if _, err := os.Stat(filepath.Join(repo, f)); err != nil {
			t.Errorf("the repository lacks %s: %v", f, err)
		}
	}
	release, _ := os.ReadFile(filepath.Join(repo, "deb/dists/stable/Release"))
	for _, want := range []string{"Suite: stable", "Components: main", "Architectures: amd64 arm64", " main/binary-amd64/Packages\n", " main/binary-arm64/Packages\n"} {
		if !strings.Contains(string(release), want) {
			t.Errorf("Release lacks %q:\n%s", want, release)
		}
	}
	checkReleaseLists := func() {
		t.Helper()
		release, _ := os.ReadFile(filepath.Join(repo, "deb/dists/stable/Release"))
		if regexp.MustCompile(`(?m) (In)?Release(\.gpg)?$`).Match(release) {
			t.Errorf("Release lists itself or its signatures (an earlier one's):\n%s", release)
		}
	}
	checkReleaseLists()
	packages, _ := os.ReadFile(filepath.Join(repo, "deb/dists/stable/main/binary-arm64/Packages"))
	if !strings.Contains(string(packages), "Architecture: arm64\n") || strings.Contains(string(packages), "Architecture: amd64\n") {
		t.Errorf("binary-arm64/Packages lists other architectures' packages:\n%s", packages)
	}
	// Each signature verifies against the published key alone.
	keyring := key.keyring(t, repo)
	runTool(t, repo, nil, "gpgv", "--keyring", keyring, "deb/dists/stable/InRelease")
	runTool(t, repo, nil, "gpgv", "--keyring", keyring, "deb/dists/stable/Release.gpg", "deb/dists/stable/Release")
	runTool(t, repo, nil, "gpgv", "--keyring", keyring, "rpm/repodata/repomd.xml.asc", "rpm/repodata/repomd.xml")
	rpmdb := t.TempDir()
	runTool(t, repo, nil, "rpmkeys", "--dbpath", rpmdb, "--import", "fluksio-worker.asc")
	for _, rpm := range []string{"fluksio-worker-1.0.0-1.x86_64.rpm", "fluksio-worker-1.0.0-1.aarch64.rpm"} {
		if out := runTool(t, repo, nil, "rpmkeys", "--dbpath", rpmdb, "--checksig", "rpm/packages/"+rpm); !strings.Contains(out, "signatures OK") {
			t.Errorf("rpmkeys --checksig %s: %s", rpm, out)
		}
	}

	// Which sums hold for which file, as docs/releasing.md ("Verifying a
	// download") says: the repository's debs are the release's, byte for
	// byte, so SHA256SUMS holds for them; its rpms are the release's with
	// a signature added, so SHA256SUMS holds for the release's own rpm
	// (which carries no signature), and the header digest is the same in
	// both.
	sums, err := os.ReadFile(filepath.Join(v1.dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := func(path string) bool {
		t.Helper()
		sum := strings.Fields(runTool(t, repo, nil, "sha256sum", path))[0]
		return strings.Contains(string(sums), sum+"  "+filepath.Base(path)+"\n")
	}
	for _, arch := range []string{"amd64", "arm64"} {
		deb := "deb/pool/main/f/fluksio-worker/" + filepath.Base(v1.pkg(t, "deb", arch))
		if !listed(deb) {
			t.Errorf("the repository's %s is not the one SHA256SUMS lists", deb)
		}
		released := v1.pkg(t, "rpm", arch)
		served := filepath.Join(repo, "rpm/packages", filepath.Base(released))
		if !listed(released) {
			t.Errorf("SHA256SUMS does not hold for the release's %s", filepath.Base(released))
		}
		if listed(served) {
			t.Errorf("SHA256SUMS holds for the repository's signed %s: docs/releasing.md says it does not", filepath.Base(served))
		}
		header := func(rpm string) string {
			return runTool(t, repo, nil, "rpm", "-qp", "--nosignature", "--qf", "%{SHA256HEADER}\n", rpm)
		}
		// The header holds the payload's digest, so its digest stands for
		// the whole package.
		if d := runTool(t, repo, nil, "rpm", "-qp", "--nosignature", "--qf", "%{PAYLOADDIGEST}", released); len(d) != 64 {
			t.Errorf("the release's %s has no payload digest in its header (%q): its header digest does not cover the files", filepath.Base(released), d)
		}
		if header(served) != header(released) {
			t.Errorf("the repository's %s has another header digest than the release's: %s, %s", filepath.Base(served), header(served), header(released))
		}
		if out, err := exec.Command("rpmkeys", "--dbpath", rpmdb, "--checksig", released).CombinedOutput(); strings.Contains(string(out), "signatures OK") {
			t.Errorf("the release's own %s carries a signature (%v: %s): docs/releasing.md says it does not", filepath.Base(released), err, out)
		}
	}

	// Again: the packages stay as they were.
	before := treeSums(t, filepath.Join(repo, "deb/pool"), filepath.Join(repo, "rpm/packages"))
	key.publish(t, v1.dist, repo)
	if after := treeSums(t, filepath.Join(repo, "deb/pool"), filepath.Join(repo, "rpm/packages")); after != before {
		t.Errorf("publishing the same release again changed the packages:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	checkReleaseLists()

	// A deb rebuilt under a published version: other bytes, same name.
	rebuilt := t.TempDir()
	deb, err := os.ReadFile(v1.pkg(t, "deb", "amd64"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rebuilt, "fluksio-worker_1.0.0-1_amd64.deb"), append(deb, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := key.run(repo, rebuilt, repo)
	if err == nil || !strings.Contains(out, "already published with other contents") {
		t.Errorf("publishing a rebuilt 1.0.0 deb: %v\n%s\nwant a refusal", err, out)
	}
}

// TestReleaseSHA256SUMSSigned: a release's SHA256SUMS is signed with the
// release key (SHA256SUMS.asc), as docs/releasing.md has a user check a
// download: gpg verifies the signature, then sha256sum the files.
func TestReleaseSHA256SUMSSigned(t *testing.T) {
	needTool(t, "gpgv")
	v1 := sharedSnapshot(t, "1.0.0")
	sums := filepath.Join(v1.dist, "SHA256SUMS")
	if _, err := os.Stat(sums + ".asc"); err != nil {
		t.Fatalf("the release has no SHA256SUMS.asc: %v", err)
	}
	runTool(t, v1.dist, nil, "gpgv", "--keyring", v1.publicKey, "SHA256SUMS.asc", "SHA256SUMS")
	out := runTool(t, v1.dist, nil, "sha256sum", "--ignore-missing", "-c", "SHA256SUMS")
	if !strings.Contains(out, fmt.Sprintf("fluksio-worker_%s_linux_amd64.tar.gz: OK", v1.version)) {
		t.Errorf("sha256sum -c SHA256SUMS checked no linux amd64 archive:\n%s", out)
	}
	// A SHA256SUMS altered after signing fails the check.
	altered := filepath.Join(t.TempDir(), "SHA256SUMS")
	b, err := os.ReadFile(sums)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(altered, append(b, []byte(strings.Repeat("0", 64)+"  extra\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gpgv", "--keyring", v1.publicKey, sums+".asc", altered).CombinedOutput(); err == nil {
		t.Errorf("gpgv accepted a SHA256SUMS altered after signing:\n%s", out)
	}
}

// TestRepositoryForDnf reads the rpm repository with Debian's dnf, as a
// Fedora or RHEL machine would: the metadata only with its signature
// (repo_gpgcheck), both architectures listed; a repomd.xml altered after
// signing is refused. Then through the repository file install.sh writes:
// a release published after the machine last read the metadata is seen by
// a plain query two hours later (dnf's default expiry is 48 hours). No rpm
// distribution boots here, so dnf install itself, the package's scriptlets
// under a Fedora systemd and the rest of install.sh's dnf/yum branch run
// nowhere in the suite.
func TestRepositoryForDnf(t *testing.T) {
	needTool(t, "dnf")
	v1 := sharedSnapshot(t, "1.0.0")
	key := newSigningKey(t)
	repo := filepath.Join(t.TempDir(), "repo")
	key.publish(t, v1.dist, repo)

	query := func(repo string) (string, error) {
		dir := t.TempDir()
		conf := filepath.Join(dir, "dnf.conf")
		if err := os.WriteFile(conf, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("dnf", "-y", "--config", conf, "--releasever", "1",
			"--setopt=reposdir="+filepath.Join(dir, "none"), "--setopt=cachedir="+filepath.Join(dir, "cache"),
			"--installroot", filepath.Join(dir, "root"), "--forcearch", "x86_64",
			"--repofrompath=fluksio-worker,file://"+filepath.Join(repo, "rpm"),
			"--setopt=fluksio-worker.gpgcheck=1", "--setopt=fluksio-worker.repo_gpgcheck=1",
			"--setopt=fluksio-worker.gpgkey=file://"+filepath.Join(repo, "fluksio-worker.asc"),
			"repoquery", "--repo", "fluksio-worker", "--qf", "%{name} %{version}-%{release} %{arch}", "fluksio-worker")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := query(repo)
	if err != nil {
		t.Fatalf("dnf repoquery: %v\n%s", err, out)
	}
	for _, want := range []string{"fluksio-worker 1.0.0-1 x86_64", "fluksio-worker 1.0.0-1 aarch64"} {
		if !strings.Contains(out, want) {
			t.Errorf("dnf repoquery does not list %q:\n%s", want, out)
		}
	}

	// An altered repomd.xml (here: a different revision) with the old
	// signature.
	tampered := filepath.Join(t.TempDir(), "repo")
	runTool(t, repo, nil, "cp", "-a", repo, tampered)
	repomd := filepath.Join(tampered, "rpm/repodata/repomd.xml")
	b, err := os.ReadFile(repomd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(repomd, bytes.Replace(b, []byte("<revision>"), []byte("<revision>9"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := query(tampered); err == nil || !strings.Contains(out, "signature") {
		t.Errorf("dnf read a repomd.xml altered after signing: %v\n%s", err, out)
	}

	// A machine set up by install.sh, its repository file as written (the
	// repository and the key where this test keeps them), reads the
	// metadata; 1.0.1 is published; two hours later a plain query, which
	// is what `dnf upgrade` reads, must fetch the new metadata. The file
	// is older than the cache, as on a machine set up before (dnf takes
	// metadata older than its repository file as expired whatever the
	// expiry).
	v2 := sharedSnapshot(t, "1.0.1")
	dir := t.TempDir()
	reposd := filepath.Join(dir, "yum.repos.d")
	if err := os.Mkdir(reposd, 0o755); err != nil {
		t.Fatal(err)
	}
	repoFile := filepath.Join(reposd, "fluksio-worker.repo")
	text := installShRepoFile(t, "file://"+repo, "file://"+filepath.Join(repo, "fluksio-worker.asc"))
	if err := os.WriteFile(repoFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := os.Chtimes(repoFile, now.Add(-3*time.Hour), now.Add(-3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "dnf.conf")
	if err := os.WriteFile(conf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	dnf := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("dnf", append([]string{"-y", "--config", conf, "--releasever", "1",
			"--setopt=reposdir=" + reposd, "--setopt=cachedir=" + cache,
			"--installroot", filepath.Join(dir, "root"), "--forcearch", "x86_64"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("dnf %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	versions := []string{"repoquery", "--repo", "fluksio-worker", "--arch", "x86_64", "--qf", "%{version}-%{release}", "fluksio-worker"}
	if out := dnf(versions...); !strings.Contains(out, "1.0.0-1") || strings.Contains(out, "1.0.1-1") {
		t.Fatalf("dnf through install.sh's repository file, before 1.0.1 is published:\n%s", out)
	}
	key.publish(t, v2.dist, repo)
	err = filepath.Walk(cache, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(path, now.Add(-2*time.Hour), now.Add(-2*time.Hour))
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := dnf(versions...); !strings.Contains(out, "1.0.1-1") {
		t.Errorf("two hours after dnf last read the repository, and 1.0.1 published since, dnf still lists only:\n%s\n(install.sh's repository file:\n%s)", out, text)
	}
}

// installShRepoFile is the yum/dnf repository file install.sh writes, with
// the repository at repoURL and the key at keyURL instead of the machine's
// /etc/pki/rpm-gpg/ (which a test does not write).
func installShRepoFile(t *testing.T, repoURL, keyURL string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "packaging/install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)cat >"\$tmp/repo" <<EOF\n(.*?\n)EOF\n`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`packaging/install.sh has no repository file (cat >"$tmp/repo" <<EOF ... EOF)`)
	}
	text := strings.ReplaceAll(string(m[1]), "$repo", repoURL)
	const pkiKey = "file:///etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker"
	if !strings.Contains(text, "gpgkey="+pkiKey+"\n") {
		t.Fatalf("install.sh's repository file names no gpgkey=%s:\n%s", pkiKey, text)
	}
	text = strings.ReplaceAll(text, pkiKey, keyURL)
	if strings.Contains(text, "$") {
		t.Fatalf("install.sh's repository file has a variable this test does not know:\n%s", text)
	}
	return text
}

// TestRepositoryFilesAgree: the yum/dnf repository file docs/releasing.md
// shows, for setting the repository up by hand, is the one install.sh
// writes for the default repository.
func TestRepositoryFilesAgree(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "docs/releasing.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)<<'REPO'\n(.*?\n)REPO\n`).FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/releasing.md shows no repository file (<<'REPO' ... REPO)")
	}
	const pkiKey = "file:///etc/pki/rpm-gpg/RPM-GPG-KEY-fluksio-worker"
	if want := installShRepoFile(t, "https://packages.fluksio.io", pkiKey); string(m[1]) != want {
		t.Errorf("docs/releasing.md shows the repository file\n%s\ninstall.sh writes\n%s", m[1], want)
	}
}

// TestInstallScriptAndPackageNameOneNextCommand: a first install through
// install.sh shows the package's own message (its postinst, in apt's or
// dnf's output), then the script's: both name one command to run next.
func TestInstallScriptAndPackageNameOneNextCommand(t *testing.T) {
	root := moduleRoot(t)
	command := regexp.MustCompile(`sudo fluksio-worker install --url wss://ENGINE[^"\n]*`)
	seen := map[string][]string{}
	for _, f := range []string{"packaging/install.sh", "packaging/scripts/postinstall.sh"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		found := command.FindAllString(string(b), -1)
		if len(found) == 0 {
			t.Errorf("%s prints no next command (sudo fluksio-worker install --url wss://ENGINE...)", f)
		}
		for _, c := range found {
			seen[strings.TrimSpace(c)] = append(seen[strings.TrimSpace(c)], f)
		}
	}
	if len(seen) != 1 {
		t.Errorf("install.sh and the package print %d different next commands, want one: %q", len(seen), seen)
	}
}

// TestInstallScriptRefusesUnknownSystems runs install.sh where it has no
// package to install: it stops before changing anything, says why and what
// to do instead. The script runs with a PATH of only the tools the case
// needs; the package managers are stand-ins that record being called.
func TestInstallScriptRefusesUnknownSystems(t *testing.T) {
	script := filepath.Join(moduleRoot(t), "packaging/install.sh")
	for _, tc := range []struct {
		name  string
		tools map[string]string // stand-ins: name -> script body
		want  []string
	}{
		{"no package manager", nil,
			[]string{"found no apt-get, dnf or yum", "download the tar.gz", "fluksio-worker install --url"}},
		{"zypper", map[string]string{"zypper": "exit 0"},
			[]string{"zypper (openSUSE, SLES) is not supported yet", "zypper install ./fluksio-worker-"}},
		{"apt on riscv64", map[string]string{"apt-get": "exit 0", "dpkg": "echo riscv64"},
			[]string{"no fluksio-worker package for the riscv64 architecture", "go install github.com/fluksio/fluksio-worker@latest"}},
		{"dnf on s390x", map[string]string{"dnf": "exit 0", "uname": "echo s390x"},
			[]string{"no fluksio-worker package for the s390x architecture"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			calls := filepath.Join(t.TempDir(), "calls")
			for _, tool := range []string{"sh", "id", "uname", "mktemp", "rm", "cmp", "cat", "grep", "install", "mkdir"} {
				if _, ok := tc.tools[tool]; ok {
					continue
				}
				path, err := exec.LookPath(tool)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(path, filepath.Join(bin, tool)); err != nil {
					t.Fatal(err)
				}
			}
			for name, body := range tc.tools {
				stub := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >>%s\n%s\n", name, calls, body)
				if err := os.WriteFile(filepath.Join(bin, name), []byte(stub), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(filepath.Join(bin, "sh"), script)
			cmd.Env = []string{"PATH=" + bin, "FLUKSIO_REPO_URL=http://127.0.0.1:9/"}
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("install.sh succeeded:\n%s", out)
			}
			for _, want := range tc.want {
				if !strings.Contains(string(out), want) {
					t.Errorf("install.sh says:\n%s\nwant it to say %q", out, want)
				}
			}
			recorded, _ := os.ReadFile(calls)
			for _, line := range strings.Split(strings.TrimSpace(string(recorded)), "\n") {
				if line != "" && line != "dpkg --print-architecture" && line != "uname -m" {
					t.Errorf("install.sh ran %q before refusing", line)
				}
			}
		})
	}
}

// TestInstallScriptFromRepositoryUnderSystemd is the operator's path on a
// Debian with a real systemd: the repository served over loopback HTTP,
// install.sh piped into sh, then `fluksio-worker install`, active and
// attached; the script again changes nothing; a newer release published
// and `apt-get update && apt-get upgrade` with a call running: the call
// finishes and the worker reloads in place; a Packages file altered after
// signing is refused by apt. Then `install.sh --remove`: apt-get update no
// longer fetches the repository.
func TestInstallScriptFromRepositoryUnderSystemd(t *testing.T) {
	nspawn.Require(t)
	v1 := sharedSnapshot(t, "1.0.0")
	v2 := sharedSnapshot(t, "1.0.1")
	key := newSigningKey(t)
	repo := filepath.Join(t.TempDir(), "repo")
	key.publish(t, v1.dist, repo)
	// fetched counts the requests the repository's server answers.
	var fetched atomic.Int64
	files := http.FileServer(http.Dir(repo))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetched.Add(1)
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	step := stepTimer(t)
	m := bootMachine(ctx, t)
	sh := machineShell(ctx, t, m)
	step("boot")
	// The test machine has no Debian mirror to reach (python3, the one
	// dependency, is in the image): the repository under test is its only
	// source.
	sh("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*")
	if err := m.CopyIn(filepath.Join(repo, "install.sh"), "/root/install.sh"); err != nil {
		t.Fatal(err)
	}
	// As `curl -fsSL URL/install.sh | sh` runs it: the script on stdin.
	installScript := "FLUKSIO_REPO_URL=" + srv.URL + " sh </root/install.sh 2>&1"
	out := sh(installScript)
	t.Logf("install.sh:\n%s", out)
	if !strings.Contains(out, "sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token -") {
		t.Errorf("install.sh does not print the next command:\n%s", out)
	}
	// The package said what to run next (its postinst, in apt's output),
	// then the script did: the same command.
	next := regexp.MustCompile(`(?m)^\s*(sudo fluksio-worker install --url .*?)\s*$`).FindAllStringSubmatch(out, -1)
	if len(next) < 2 {
		t.Errorf("a first install through install.sh prints the next command %d times, want the package's and the script's:\n%s", len(next), out)
	}
	for _, c := range next {
		if c[1] != next[0][1] {
			t.Errorf("a first install through install.sh prints two next commands, %q and %q:\n%s", next[0][1], c[1], out)
			break
		}
	}
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v1.version {
		t.Errorf("install.sh installed %q, want %s", got, v1.version)
	}
	wantList := "deb [signed-by=/etc/apt/keyrings/fluksio-worker.asc] " + srv.URL + "/deb stable main\n"
	if list, err := os.ReadFile(m.Path("/etc/apt/sources.list.d/fluksio-worker.list")); err != nil || string(list) != wantList {
		t.Errorf("the apt source is %q (%v), want %q", list, err, wantList)
	}
	published, _ := os.ReadFile(filepath.Join(repo, "fluksio-worker.asc"))
	if installed, err := os.ReadFile(m.Path("/etc/apt/keyrings/fluksio-worker.asc")); err != nil || !bytes.Equal(installed, published) {
		t.Errorf("/etc/apt/keyrings/fluksio-worker.asc is not the repository's key (%v)", err)
	}
	// Trusted for this source only, not for every source apt has.
	if out := sh("ls /etc/apt/trusted.gpg.d/ /etc/apt/trusted.gpg 2>/dev/null || true"); strings.Contains(out, "fluksio") {
		t.Errorf("install.sh made the key trusted for every source:\n%s", out)
	}
	step("install.sh")

	const token = "repo-test-token-41c9"
	eng := startEngine(t, enginetest.Options{Tokens: []string{token}})
	sh(fmt.Sprintf("umask 077 && printf '%%s\\n' %s > /root/token", token))
	sh(fmt.Sprintf("fluksio-worker install --url %s --token - </root/token", eng.AttachURL()))
	if state := strings.TrimSpace(sh("systemctl is-active fluksio-worker || true")); state != "active" {
		t.Fatalf("after install the service is %q", state)
	}
	w := liveWorker(ctx, t, eng)
	runDouble(ctx, t, w, "c1", 21)
	pid1 := mainPID(t, sh)
	step("fluksio-worker install, attach, run a node")

	// The script again, with the service running: nothing written, nothing
	// restarted.
	watched := "/etc/apt/keyrings/fluksio-worker.asc /etc/apt/sources.list.d/fluksio-worker.list /etc/fluksio-worker/config.toml /etc/systemd/system/fluksio-worker.service"
	state := func() string {
		return sh("stat -c '%n %s %Y %a %U' " + watched + " && dpkg-query -W fluksio-worker")
	}
	before := state()
	out = sh(installScript)
	if after := state(); after != before {
		t.Errorf("install.sh run again changed the system:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if strings.Contains(out, "wrote ") || !strings.Contains(out, "already set up") {
		t.Errorf("install.sh run again does not say it had nothing to do:\n%s", out)
	}
	if pid := mainPID(t, sh); pid != pid1 {
		t.Errorf("install.sh run again restarted the service (MainPID %s, was %s)", pid, pid1)
	}
	step("install.sh again")

	// A newer release, published while a call runs; the operator upgrades
	// as for any package.
	const longSeconds = 20
	long := startLongNode(ctx, t, w, "long1", longSeconds)
	key.publish(t, v2.dist, repo)
	sh("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q </dev/null")
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v2.version {
		t.Errorf("after apt-get upgrade: %q, want %s", got, v2.version)
	}
	finishLongNode(ctx, t, long, longSeconds)
	serviceGone(t, w)
	w = liveWorker(ctx, t, eng)
	if pid := mainPID(t, sh); pid != pid1 {
		t.Errorf("the upgrade restarted the service (MainPID %s, was %s); it must reload in place", pid, pid1)
	}
	eventuallyIn(t, 10*time.Second, "status to show the new version attached", func() (bool, string) {
		out, _ := m.Exec(ctx, "fluksio-worker status")
		return strings.Contains(out, "fluksio-worker "+v2.version) && strings.Contains(out, "attached as"), out
	})
	runDouble(ctx, t, w, "c2", 50)
	step("publish 1.0.1, apt-get upgrade with a call running")

	// Someone with write access to the server (not to the key) alters the
	// Packages index after signing: a version 9.9.9 pointing at 1.0.1's file.
	dir := filepath.Join(repo, "deb/dists/stable/main/binary-"+runtime.GOARCH)
	index, err := os.ReadFile(filepath.Join(dir, "Packages"))
	if err != nil {
		t.Fatal(err)
	}
	altered := regexp.MustCompile(`(?m)^Version: 1\.0\.1-1$`).ReplaceAll(index, []byte("Version: 9.9.9-1"))
	if bytes.Equal(altered, index) {
		t.Fatalf("no 1.0.1 entry to alter in Packages:\n%s", index)
	}
	writeIndex(t, dir, altered)
	// The InRelease is the same, so a machine that already has this
	// release's lists fetches nothing; a machine new to the repository (its
	// lists cleared here) fetches the altered index.
	sh("rm -f /var/lib/apt/lists/127.0.0.1*")
	out, err = m.Exec(ctx, "apt-get update -q 2>&1")
	if err == nil {
		t.Errorf("apt-get update accepted a Packages altered after signing:\n%s", out)
	}
	if policy := sh("apt-cache policy fluksio-worker"); strings.Contains(policy, "9.9.9") {
		t.Errorf("apt offers the altered index's version:\n%s\napt-get update said:\n%s", policy, out)
	}
	t.Logf("apt-get update, Packages altered after signing:\n%s", out)
	step("a Packages altered after signing")

	// Taking the repository out, as `curl URL/install.sh | sh -s --
	// --remove` does: the source and the key removed and named, the
	// package left with the command that removes it; apt-get update then
	// fetches nothing from the repository; run again, nothing to remove.
	removeScript := "sh -s -- --remove </root/install.sh 2>&1"
	out = sh(removeScript)
	t.Logf("install.sh --remove:\n%s", out)
	for _, want := range []string{
		"removed /etc/apt/sources.list.d/fluksio-worker.list",
		"removed /etc/apt/keyrings/fluksio-worker.asc",
		"sudo apt purge fluksio-worker",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("install.sh --remove does not say %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"/etc/apt/sources.list.d/fluksio-worker.list", "/etc/apt/keyrings/fluksio-worker.asc"} {
		if _, err := os.Stat(m.Path(f)); !os.IsNotExist(err) {
			t.Errorf("after install.sh --remove, %s is still there (%v)", f, err)
		}
	}
	if got := strings.TrimSpace(sh("fluksio-worker --version")); got != "fluksio-worker "+v2.version {
		t.Errorf("install.sh --remove changed the package: %q, want %s installed", got, v2.version)
	}
	fetched.Store(0)
	sh("apt-get update -q 2>&1")
	if n := fetched.Load(); n != 0 {
		t.Errorf("after install.sh --remove, apt-get update made %d requests to the repository", n)
	}
	if policy := sh("apt-cache policy fluksio-worker"); strings.Contains(policy, srv.URL) {
		t.Errorf("after install.sh --remove and apt-get update, apt still offers the repository:\n%s", policy)
	}
	if out := sh(removeScript); !strings.Contains(out, "found no fluksio-worker repository or key to remove") || strings.Contains(out, "removed ") {
		t.Errorf("install.sh --remove run again:\n%s\nwant it to say it found nothing to remove", out)
	}
	step("install.sh --remove")
}

// writeIndex replaces dir's Packages and Packages.gz with b.
func writeIndex(t *testing.T, dir string, b []byte) {
	t.Helper()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(b)
	zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "Packages"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Packages.gz"), gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// signingKey is a throwaway OpenPGP key in its own GNUPGHOME, standing in
// for the project's release key. packaging holds the key's own copy of the
// publishing scripts (pinnedPackaging).
type signingKey struct {
	home, fingerprint, root, packaging string
}

func newSigningKey(t *testing.T) signingKey {
	t.Helper()
	for _, tool := range []string{"gpg", "gpgv", "apt-ftparchive", "createrepo_c", "rpmsign", "rpmkeys"} {
		needTool(t, tool)
	}
	k := genSigningKey(t, t.TempDir())
	t.Cleanup(k.stopAgent)
	k.packaging = pinnedPackaging(t, k.root, k.fingerprint)
	return k
}

// releaseKeyLine is install.sh's line naming the one key it trusts.
var releaseKeyLine = regexp.MustCompile(`(?m)^release_key=([0-9A-F]{40})$`)

// pinnedPackaging is a copy of packaging/'s publishing scripts whose
// install.sh trusts the key fingerprint instead of the release key.
// repository.sh signs only with the key the install.sh beside it trusts,
// and that install.sh is what the repository publishes: so a test key gets
// its own copy, as a release key would get its own install.sh. The
// scripts take no setting that changes the key they trust.
func pinnedPackaging(t *testing.T, root, fingerprint string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"repository.sh", "publish.sh", "install.sh"} {
		b, err := os.ReadFile(filepath.Join(root, "packaging", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "install.sh" {
			if n := len(releaseKeyLine.FindAll(b, -1)); n != 1 {
				t.Fatalf("packaging/install.sh has %d release_key= lines, want 1", n)
			}
			b = releaseKeyLine.ReplaceAll(b, []byte("release_key="+fingerprint))
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// stopAgent ends the gpg-agent gpg started for the key's GNUPGHOME.
func (k signingKey) stopAgent() {
	cmd := exec.Command("gpgconf", "--kill", "all")
	cmd.Env = append(os.Environ(), "GNUPGHOME="+k.home)
	cmd.Run()
}

// genSigningKey makes a key in the GNUPGHOME home.
func genSigningKey(t *testing.T, home string) signingKey {
	t.Helper()
	k := signingKey{home: home, root: moduleRoot(t)}
	env := []string{"GNUPGHOME=" + home}
	runTool(t, home, env, "gpg", "--batch", "--passphrase", "", "--quick-gen-key", "fluksio-worker test key <test@fluksio.invalid>", "ed25519", "sign", "never")
	out := runTool(t, home, env, "gpg", "--batch", "--with-colons", "--list-secret-keys")
	if m := regexp.MustCompile(`(?m)^fpr:+([0-9A-F]{40}):`).FindStringSubmatch(out); m != nil {
		k.fingerprint = m[1]
	} else {
		t.Fatalf("no fingerprint in:\n%s", out)
	}
	return k
}

// run runs the key's repository.sh DIST REPO with the key.
func (k signingKey) run(dir, dist, repo string) (string, error) {
	return k.script(dir, "repository.sh", dist, repo)
}

// script runs the key's copy of a packaging script, signing with the key.
func (k signingKey) script(dir, name string, args ...string) (string, error) {
	cmd := exec.Command("sh", append([]string{filepath.Join(k.packaging, name)}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GNUPGHOME="+k.home, "FLUKSIO_SIGNING_KEY="+k.fingerprint)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (k signingKey) publish(t *testing.T, dist, repo string) {
	t.Helper()
	if out, err := k.run(k.root, dist, repo); err != nil {
		t.Fatalf("packaging/repository.sh %s %s: %v\n%s", dist, repo, err, out)
	}
}

// keyring is the repository's published key as a keyring gpgv reads.
func (k signingKey) keyring(t *testing.T, repo string) string {
	t.Helper()
	keyring := filepath.Join(t.TempDir(), "key.gpg")
	runTool(t, repo, []string{"GNUPGHOME=" + k.home}, "gpg", "--batch", "--yes", "--output", keyring, "--dearmor", filepath.Join(repo, "fluksio-worker.asc"))
	return keyring
}

// treeSums lists every file under dirs with its sha256.
func treeSums(t *testing.T, dirs ...string) string {
	t.Helper()
	return runTool(t, "/", nil, "sh", append([]string{"-c", `find "$@" -type f -exec sha256sum {} + | sort`, "sh"}, dirs...)...)
}

// sharedSnapshot is a snapshot release build of version, made once per
// test binary and shared by the tests that only read it.
func sharedSnapshot(t *testing.T, version string) release {
	t.Helper()
	if testing.Short() {
		t.Skip("builds every release target; skipped with -short")
	}
	snapshotsMu.Lock()
	s, ok := snapshots[version]
	if !ok {
		s = &sharedRelease{}
		snapshots[version] = s
	}
	snapshotsMu.Unlock()
	s.once.Do(func() {
		goreleaser := installGoreleaser(t)
		dir, err := binDirOnce()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(dir, "snapshot-"+version)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The release signs its SHA256SUMS: with a throwaway key here,
		// whose public half stays beside the build.
		needTool(t, "gpg")
		home := filepath.Join(dir, "gnupg")
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		key := genSigningKey(t, home)
		defer key.stopAgent()
		start := time.Now()
		r := snapshotIn(t, goreleaser, moduleRoot(t), version, dir, []string{"GNUPGHOME=" + home, "FLUKSIO_SIGNING_KEY=" + key.fingerprint})
		t.Logf("goreleaser release --snapshot %s: %v", version, time.Since(start).Round(time.Millisecond))
		r.publicKey = filepath.Join(dir, "release-key.gpg")
		runTool(t, dir, []string{"GNUPGHOME=" + home}, "gpg", "--batch", "--output", r.publicKey, "--export", key.fingerprint)
		s.r = r
	})
	if s.r.dist == "" {
		t.Fatalf("the snapshot build of %s failed (in this or an earlier test)", version)
	}
	return s.r
}

type sharedRelease struct {
	once sync.Once
	r    release
}

var (
	snapshotsMu sync.Mutex
	snapshots   = map[string]*sharedRelease{}
)
