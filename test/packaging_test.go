package test

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// goreleaserModule is the GoReleaser the release config is tested with; CI
// and this test install exactly this one.
const goreleaserModule = "github.com/goreleaser/goreleaser/v2@v2.15.1"

// TestPackages builds the release with GoReleaser (snapshot, nothing
// published) and checks what a user downloads: four static binaries that
// know their version, archives with the docs, checksums that match, and a
// deb and an rpm with the binary, the docs, python3 as a dependency and the
// maintainer scripts from packaging/. Then, under a real systemd, the deb's
// whole life: install, attach as a service, upgrade, remove, purge.
func TestPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every release target; skipped with -short")
	}
	goreleaser := installGoreleaser(t)
	root := moduleRoot(t)

	start := time.Now()
	runTool(t, root, nil, goreleaser, "check")
	t.Logf("goreleaser check: %v", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	v1 := sharedSnapshot(t, "1.0.0")
	t.Logf("goreleaser release --snapshot (4 binaries, 4 archives, deb, rpm): %v", time.Since(start).Round(time.Millisecond))

	t.Run("binaries", func(t *testing.T) { checkBinaries(t, v1) })
	t.Run("archives", func(t *testing.T) { checkArchives(t, v1) })
	t.Run("checksums", func(t *testing.T) { checkChecksums(t, v1) })
	t.Run("deb", func(t *testing.T) { checkDeb(t, root, v1) })
	t.Run("rpm", func(t *testing.T) { checkRPM(t, root, v1) })
	t.Run("lintian", func(t *testing.T) { lintDeb(t, root, v1) })
	t.Run("rpmlint", func(t *testing.T) { lintRPM(t, root, v1) })
	t.Run("image", func(t *testing.T) { checkImage(t, v1.dist, v1.version) })
	t.Run("systemd", func(t *testing.T) {
		start := time.Now()
		v2 := sharedSnapshot(t, "1.0.1")
		t.Logf("second snapshot build (the upgrade): %v", time.Since(start).Round(time.Millisecond))
		debUnderSystemd(t, v1, v2)
	})
}

// release is one snapshot build's output.
type release struct {
	version   string
	dist      string
	artifacts []artifact
	publicKey string // the key that signed SHA256SUMS, as a keyring gpgv reads
}

// artifact is an entry of GoReleaser's dist/artifacts.json.
type artifact struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Goos   string `json:"goos"`
	Goarch string `json:"goarch"`
	Type   string `json:"type"`
}

func (r release) ofType(typ string) []artifact {
	var out []artifact
	for _, a := range r.artifacts {
		if a.Type == typ {
			out = append(out, a)
		}
	}
	return out
}

// pkg is the path of the deb or rpm for goarch.
func (r release) pkg(t *testing.T, format, goarch string) string {
	t.Helper()
	for _, a := range r.ofType("Linux Package") {
		if a.Goarch == goarch && strings.HasSuffix(a.Name, "."+format) {
			return a.Path
		}
	}
	t.Fatalf("no %s for %s among %v", format, goarch, r.ofType("Linux Package"))
	return ""
}

// installGoreleaser finds the pinned GoReleaser: on PATH if that one is
// the right version (CI installs it), else installed into a cache directory
// (fast after the first time), so the test always runs the version the
// config was written for.
func installGoreleaser(t *testing.T) string {
	t.Helper()
	waitForCITools(t)
	version := goreleaserModule[strings.LastIndex(goreleaserModule, "@")+1:]
	if exe, err := exec.LookPath("goreleaser"); err == nil {
		out, _ := exec.Command(exe, "--version").CombinedOutput()
		if regexp.MustCompile(`(?m)^GitVersion:\s+` + regexp.QuoteMeta(version) + `$`).Match(out) {
			return exe
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "fluksio-worker-test", "goreleaser-"+version)
	exe := filepath.Join(bin, "goreleaser")
	if _, err := os.Stat(exe); err == nil {
		return exe
	}
	start := time.Now()
	cmd := exec.Command("go", "install", goreleaserModule)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("go install %s: %v\n%s", goreleaserModule, err, out)
		}
		t.Skipf("cannot install %s (offline?): %v\n%s", goreleaserModule, err, out)
	}
	t.Logf("installed goreleaser %s in %v", version, time.Since(start).Round(time.Second))
	return exe
}

// snapshotIn runs `goreleaser release --snapshot` with the given version
// into dir/dist, so the repository's own dist/ is never touched
// (sharedSnapshot: once per test binary).
func snapshotIn(t *testing.T, goreleaser, root, version, dir string, env []string) release {
	t.Helper()
	dist := filepath.Join(dir, "dist")
	config, err := os.ReadFile(filepath.Join(root, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?m)^dist:`).Match(config) {
		t.Fatal(".goreleaser.yaml sets dist:, which this test needs to point at a temp dir")
	}
	tmpConfig := filepath.Join(dir, "goreleaser.yaml")
	if err := os.WriteFile(tmpConfig, append(config, []byte("\ndist: "+dist+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, root, append([]string{"FLUKSIO_SNAPSHOT_VERSION=" + version}, env...),
		goreleaser, "release", "--snapshot", "--clean", "--skip=publish", "--config", tmpConfig)
	b, err := os.ReadFile(filepath.Join(dist, "artifacts.json"))
	if err != nil {
		t.Fatal(err)
	}
	r := release{version: version, dist: dist}
	if err := json.Unmarshal(b, &r.artifacts); err != nil {
		t.Fatalf("dist/artifacts.json: %v", err)
	}
	for i, a := range r.artifacts {
		if !filepath.IsAbs(a.Path) {
			r.artifacts[i].Path = filepath.Join(root, a.Path)
		}
	}
	return r
}

var targets = []struct{ goos, goarch string }{
	{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"},
}

func checkBinaries(t *testing.T, r release) {
	bins := r.ofType("Binary")
	for _, target := range targets {
		i := slices.IndexFunc(bins, func(a artifact) bool { return a.Goos == target.goos && a.Goarch == target.goarch })
		if i < 0 {
			t.Errorf("no binary for %s/%s", target.goos, target.goarch)
			continue
		}
		path := bins[i].Path
		switch target.goos {
		case "linux":
			checkStaticELF(t, path, target.goarch)
		case "darwin":
			f, err := macho.Open(path)
			if err != nil {
				t.Errorf("%s: %v", path, err)
				continue
			}
			want := map[string]macho.Cpu{"amd64": macho.CpuAmd64, "arm64": macho.CpuArm64}[target.goarch]
			if f.Cpu != want {
				t.Errorf("%s: cpu %v, want %v", path, f.Cpu, want)
			}
			f.Close()
		}
		if target.goos == runtime.GOOS && target.goarch == runtime.GOARCH {
			out, err := exec.Command(path, "--version").CombinedOutput()
			if got := strings.TrimSpace(string(out)); err != nil || got != "fluksio-worker "+r.version {
				t.Errorf("%s --version = %q, %v; want the stamped version %s", path, got, err, r.version)
			}
		}
	}
}

// checkStaticELF: no program interpreter and no shared libraries, so the
// binary runs on any Linux of its architecture, glibc or musl or none.
func checkStaticELF(t *testing.T, path, goarch string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
	if f.Machine != want {
		t.Errorf("%s: machine %v, want %v", path, f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (has PT_INTERP); CGO_ENABLED=0 should make it static", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v", path, libs)
	}
}

func checkArchives(t *testing.T, r release) {
	archives := r.ofType("Archive")
	if len(archives) != len(targets) {
		t.Errorf("%d archives, want %d: %v", len(archives), len(targets), archives)
	}
	for _, a := range archives {
		names := tarNames(t, a.Path)
		for _, want := range []string{"fluksio-worker", "README.md", "LICENSE", "config.example.toml", "fluksio-worker.sbatch",
			"man/fluksio-worker.1.gz", "completions/fluksio-worker.bash",
			"monitoring/fluksio-worker.rules.yaml", "monitoring/fluksio-worker-dashboard.json", "completions/_fluksio-worker", "completions/fluksio-worker.fish"} {
			if !slices.Contains(names, want) {
				t.Errorf("%s lacks %s (has %v)", a.Name, want, names)
			}
		}
		wantName := fmt.Sprintf("fluksio-worker_%s_%s_%s.tar.gz", r.version, a.Goos, a.Goarch)
		if a.Name != wantName {
			t.Errorf("archive named %s, want %s", a.Name, wantName)
		}
	}
}

// walkTar hands each entry of the tar.gz archive at path to fn, in order,
// until fn reports true; it reports whether one did.
func walkTar(t *testing.T, path string, fn func(h *tar.Header, r io.Reader) bool) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if fn(h, tr) {
			return true
		}
	}
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	var names []string
	walkTar(t, path, func(h *tar.Header, _ io.Reader) bool {
		names = append(names, h.Name)
		return false
	})
	return names
}

// checkChecksums: SHA256SUMS covers every archive, package and SBOM, and
// each sum is right.
func checkChecksums(t *testing.T, r release) {
	sums := r.ofType("Checksum")
	if len(sums) != 1 {
		t.Fatalf("want one checksums file, got %v", sums)
	}
	f, err := os.Open(sums[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if ok {
			listed[name] = sum
		}
	}
	for _, a := range slices.Concat(r.ofType("Archive"), r.ofType("Linux Package"), r.ofType("SBOM")) {
		sum, ok := listed[a.Name]
		if !ok {
			t.Errorf("SHA256SUMS does not list %s", a.Name)
			continue
		}
		b, err := os.ReadFile(a.Path)
		if err != nil {
			t.Fatal(err)
		}
		got := sha256.Sum256(b)
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("SHA256SUMS: wrong sum for %s", a.Name)
		}
	}
}

// The files both packages must carry, and where.
var packagedFiles = []string{
	"/usr/bin/fluksio-worker",
	"/usr/share/doc/fluksio-worker/README.md",
	"/usr/share/doc/fluksio-worker/config.example.toml",
	"/usr/share/doc/fluksio-worker/CLUSTER.md",
	"/usr/share/doc/fluksio-worker/examples/fluksio-worker.sbatch",
	"/usr/share/doc/fluksio-worker/examples/monitoring/fluksio-worker.rules.yaml",
	"/usr/share/doc/fluksio-worker/examples/monitoring/fluksio-worker-dashboard.json",
	"/usr/share/man/man1/fluksio-worker.1.gz",
	"/usr/share/bash-completion/completions/fluksio-worker",
	"/usr/share/fish/vendor_completions.d/fluksio-worker.fish",
}

// The files only one of them carries: where Debian and Fedora differ.
var debFiles = []string{
	"/usr/share/doc/fluksio-worker/copyright",
	"/usr/share/doc/fluksio-worker/changelog.Debian.gz",
	"/usr/share/zsh/vendor-completions/_fluksio-worker",
	"/usr/share/lintian/overrides/fluksio-worker",
}
var rpmFiles = []string{
	"/usr/share/licenses/fluksio-worker/LICENSE",
	"/usr/share/zsh/site-functions/_fluksio-worker",
}

var maintainerScripts = map[string]string{ // deb control file -> packaging/scripts
	"preinst":  "preinstall.sh",
	"postinst": "postinstall.sh",
	"prerm":    "preremove.sh",
	"postrm":   "postremove.sh",
}

func checkDeb(t *testing.T, root string, r release) {
	needTool(t, "dpkg-deb")
	for _, goarch := range []string{"amd64", "arm64"} {
		deb := r.pkg(t, "deb", goarch)
		info := runTool(t, root, nil, "dpkg-deb", "--info", deb)
		for _, want := range []string{
			"Package: fluksio-worker",
			"Version: " + r.version + "-1",
			"Architecture: " + goarch,
			"Depends: python3",
			"Pre-Depends: passwd",
		} {
			if !strings.Contains(info, "\n "+want+"\n") {
				t.Errorf("%s: control lacks %q:\n%s", filepath.Base(deb), want, info)
			}
		}
		contents := runTool(t, root, nil, "dpkg-deb", "--contents", deb)
		for _, want := range append(packagedFiles, debFiles...) {
			if !strings.Contains(contents, " ."+want+"\n") {
				t.Errorf("%s does not hold %s:\n%s", filepath.Base(deb), want, contents)
			}
		}
		checkModes(t, filepath.Base(deb), contents, "./usr/bin/fluksio-worker")
		if strings.Contains(contents, "./etc/") {
			t.Errorf("%s ships files under /etc; the config is written by `install`, not packaged:\n%s", filepath.Base(deb), contents)
		}
		control := filepath.Join(t.TempDir(), "control")
		runTool(t, root, nil, "dpkg-deb", "--control", deb, control)
		for name, script := range maintainerScripts {
			got, err := os.ReadFile(filepath.Join(control, name))
			if err != nil {
				t.Errorf("%s: no %s: %v", filepath.Base(deb), name, err)
				continue
			}
			want, _ := os.ReadFile(filepath.Join(root, "packaging", "scripts", script))
			if string(got) != string(want) {
				t.Errorf("%s: %s is not packaging/scripts/%s", filepath.Base(deb), name, script)
			}
		}
	}
}

func checkRPM(t *testing.T, root string, r release) {
	needTool(t, "rpm")
	for _, goarch := range []string{"amd64", "arm64"} {
		rpm := r.pkg(t, "rpm", goarch)
		name := filepath.Base(rpm)
		info := runTool(t, root, nil, "rpm", "-qp", "--queryformat", "%{NAME} %{VERSION} %{ARCH} %{LICENSE}\n", rpm)
		wantArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[goarch]
		if want := fmt.Sprintf("fluksio-worker %s %s MIT", r.version, wantArch); !strings.Contains(info, want) {
			t.Errorf("%s: header %q, want %q", name, info, want)
		}
		requires := runTool(t, root, nil, "rpm", "-qp", "--requires", rpm)
		for _, want := range []string{"python3", "shadow-utils"} {
			if !slices.Contains(strings.Fields(requires), want) {
				t.Errorf("%s does not require %s:\n%s", name, want, requires)
			}
		}
		list := runTool(t, root, nil, "rpm", "-qp", "--list", rpm)
		for _, want := range append(packagedFiles, rpmFiles...) {
			if !slices.Contains(strings.Split(list, "\n"), want) {
				t.Errorf("%s does not hold %s:\n%s", name, want, list)
			}
		}
		checkModes(t, name, runTool(t, root, nil, "rpm", "-qp", "--list", "-v", rpm), "/usr/bin/fluksio-worker")
		// Documents are marked so (rpm --excludedocs leaves them out), and
		// the licence as one.
		docs := strings.Fields(runTool(t, root, nil, "rpm", "-qp", "--docfiles", rpm))
		for _, f := range append(packagedFiles, rpmFiles...) {
			isDoc := strings.HasPrefix(f, "/usr/share/doc/") || strings.HasPrefix(f, "/usr/share/man/")
			if isDoc != slices.Contains(docs, f) {
				t.Errorf("%s: %s marked as documentation: %v, want %v (docs: %v)", name, f, !isDoc, isDoc, docs)
			}
		}
		if licences := strings.TrimSpace(runTool(t, root, nil, "rpm", "-qp", "--licensefiles", rpm)); licences != "/usr/share/licenses/fluksio-worker/LICENSE" {
			t.Errorf("%s: licence files %q, want the LICENSE", name, licences)
		}
		scripts := runTool(t, root, nil, "rpm", "-qp", "--scripts", rpm)
		for _, phase := range []string{"preinstall", "postinstall", "preuninstall", "postuninstall"} {
			if !strings.Contains(scripts, phase+" scriptlet (using /bin/sh)") {
				t.Errorf("%s: no %s scriptlet:\n%s", name, phase, scripts)
			}
		}
		// rpm passes counts, not verbs; each script must know both.
		for _, want := range []string{"useradd --system", "install --refresh-unit", `remove | 0)`, "try-restart"} {
			if !strings.Contains(scripts, want) {
				t.Errorf("%s: scriptlets lack %q", name, want)
			}
		}
	}
}

// checkModes reads a long listing (dpkg-deb --contents, rpm -qplv): the
// binary is 0755 and every other file 0644, whatever the umask of the
// checkout the package was built from.
func checkModes(t *testing.T, pkg, listing, binary string) {
	t.Helper()
	for _, line := range strings.Split(listing, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "-") {
			continue // directories, blank lines
		}
		path, want := fields[len(fields)-1], "-rw-r--r--"
		if path == binary {
			want = "-rwxr-xr-x"
		}
		if fields[0] != want {
			t.Errorf("%s: %s is %s, want %s", pkg, path, fields[0], want)
		}
	}
}

// runTool runs a command in dir and returns its combined output, failing the
// test (with that output) if it fails.
func runTool(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing in CI (Debian: apt-get install rpm dpkg)", name)
		}
		t.Skipf("%s not installed", name)
	}
}

// moduleRoot is the module root: the parent of this test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}
