package test

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// cycloneDX is what TestReleaseSBOM reads of a CycloneDX JSON document.
type cycloneDX struct {
	BOMFormat   string `json:"bomFormat"`
	SpecVersion string `json:"specVersion"`
	Metadata    struct {
		Component struct {
			Name, Version, Purl string
		}
		Properties []struct{ Name, Value string }
	}
	Components []struct {
		Name, Version, Purl string
	}
}

func (b cycloneDX) property(name string) string {
	for _, p := range b.Metadata.Properties {
		if p.Name == name {
			return p.Value
		}
	}
	return ""
}

// TestReleaseSBOMPerArchiveAndPackage: beside every archive and package
// of a snapshot release lies NAME.cdx.json, a CycloneDX SBOM that names
// this module at the release's version and exactly the modules the binary
// for that platform links (go list -deps), each at the version go.mod
// requires; its binary hash is the binary's inside the archive or package;
// and it names the commit that binary's `version --json` reports, HEAD.
func TestReleaseSBOMPerArchiveAndPackage(t *testing.T) {
	r := sharedSnapshot(t, "1.0.0")
	root := moduleRoot(t)
	required := goModRequires(t, root)

	binaries := map[string]string{} // goos/goarch -> the built binary
	for _, a := range r.ofType("Binary") {
		binaries[a.Goos+"/"+a.Goarch] = a.Path
	}
	// The commit: the host's binary says it; every SBOM must say the same.
	var info struct{ Revision string }
	out, err := exec.Command(binaries["linux/"+goarch(t)], "version", "--json").Output()
	if err != nil {
		t.Fatalf("version --json: %v", err)
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(root, ".git")); err == nil && !fi.IsDir() {
		// go build stamps no VCS information in a git worktree (.git is a
		// file there): neither version --json nor the SBOM has a commit.
		t.Logf("%s is a git worktree: the commit is not checked (run from a clone, as CI does)", root)
	} else {
		head := strings.TrimSpace(runTool(t, root, nil, "git", "rev-parse", "HEAD"))
		if info.Revision != head {
			t.Errorf("version --json names revision %q, want HEAD %s", info.Revision, head)
		}
	}

	deps := map[string]map[string]string{} // goos/goarch -> module -> version
	packaged := slices.Concat(r.ofType("Archive"), r.ofType("Linux Package"))
	if len(packaged) != len(targets)+4 {
		t.Fatalf("%d archives and packages, want %d", len(packaged), len(targets)+4)
	}
	for _, a := range packaged {
		t.Run(a.Name, func(t *testing.T) {
			path := a.Path + ".cdx.json"
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("no SBOM beside %s: %v", a.Name, err)
			}
			var bom cycloneDX
			dec := json.NewDecoder(strings.NewReader(string(b)))
			if err := dec.Decode(&bom); err != nil || bom.BOMFormat != "CycloneDX" || !strings.HasPrefix(bom.SpecVersion, "1.") {
				t.Fatalf("%s is not CycloneDX JSON (format %q, spec %q): %v", path, bom.BOMFormat, bom.SpecVersion, err)
			}
			c := bom.Metadata.Component
			if c.Name != "github.com/fluksio/fluksio-worker" || c.Version != "v"+r.version {
				t.Errorf("the SBOM describes %s %s, want github.com/fluksio/fluksio-worker v%s", c.Name, c.Version, r.version)
			}
			if goos, arch := bom.property("cdx:gomod:build:env:GOOS"), bom.property("cdx:gomod:build:env:GOARCH"); goos != a.Goos || arch != a.Goarch {
				t.Errorf("the SBOM is of a %s/%s build, the artifact is %s/%s", goos, arch, a.Goos, a.Goarch)
			}
			if rev := bom.property("cdx:gomod:build:vcs:revision"); rev != info.Revision {
				t.Errorf("the SBOM names commit %q, version --json %q", rev, info.Revision)
			}

			// The binary it describes is the one shipped.
			bin := binaries[a.Goos+"/"+a.Goarch]
			if strings.HasSuffix(a.Name, ".tar.gz") {
				bin = filepath.Join(t.TempDir(), "fluksio-worker")
				extractFromTar(t, a.Path, "fluksio-worker", bin)
			}
			if got, want := bom.property("cdx:gomod:binary:hash:SHA-256"), fileSHA256(t, bin); got != want {
				t.Errorf("the SBOM's binary has SHA-256 %s, the one shipped %s", got, want)
			}

			// The modules: exactly those linked, at go.mod's versions.
			plat := a.Goos + "/" + a.Goarch
			if deps[plat] == nil {
				deps[plat] = linkedModules(t, root, a.Goos, a.Goarch)
			}
			listed := map[string]string{}
			for _, m := range bom.Components {
				listed[m.Name] = m.Version
				if want, ok := required[m.Name]; !ok {
					t.Errorf("the SBOM lists %s %s, which go.mod does not require", m.Name, m.Version)
				} else if m.Version != want {
					t.Errorf("the SBOM lists %s %s, go.mod requires %s", m.Name, m.Version, want)
				}
				if !strings.HasPrefix(m.Purl, "pkg:golang/"+m.Name+"@"+m.Version) {
					t.Errorf("%s %s: purl %q", m.Name, m.Version, m.Purl)
				}
			}
			for mod, version := range deps[plat] {
				if listed[mod] != version {
					t.Errorf("the %s binary links %s %s; the SBOM lists %q", plat, mod, version, listed[mod])
				}
			}
			if len(listed) != len(deps[plat]) {
				t.Errorf("the SBOM lists %d modules, the %s build links %d", len(listed), plat, len(deps[plat]))
			}
		})
	}
}

// goModRequires is go.mod's require directives: module -> version.
func goModRequires(t *testing.T, root string) map[string]string {
	t.Helper()
	var mod struct {
		Require []struct{ Path, Version string }
	}
	if err := json.Unmarshal([]byte(runTool(t, root, nil, "go", "mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range mod.Require {
		out[r.Path] = r.Version
	}
	return out
}

// linkedModules is the modules (but this one) whose packages a build of
// the binary for goos/goarch compiles in.
func linkedModules(t *testing.T, root, goos, goarch string) map[string]string {
	t.Helper()
	out := runTool(t, root, []string{"GOOS=" + goos, "GOARCH=" + goarch, "CGO_ENABLED=0"},
		"go", "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", ".")
	mods := map[string]string{}
	for line := range strings.Lines(out) {
		if path, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			mods[path] = version
		}
	}
	if len(mods) == 0 {
		t.Fatalf("go list -deps for %s/%s named no module", goos, goarch)
	}
	return mods
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// extractFromTar writes the tar.gz archive's file name to dst.
func extractFromTar(t *testing.T, archive, name, dst string) {
	t.Helper()
	found := walkTar(t, archive, func(h *tar.Header, r io.Reader) bool {
		if h.Name != name {
			return false
		}
		out, err := os.Create(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		if _, err := io.Copy(out, r); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if !found {
		t.Fatalf("%s: no %s", archive, name)
	}
}

// TestHomebrewFormulaInstallsBinaryManPageAndCompletions: the release
// writes a Homebrew cask (dist/homebrew/Casks/fluksio-worker.rb) for this
// version whose archives, by URL and SHA-256, are the release's darwin
// ones, and which installs from them the binary, the manual page and the
// bash, zsh and fish completions, each a file those archives hold. Homebrew
// itself does not run here (no Mac): the cask is read, not installed.
func TestHomebrewFormulaInstallsBinaryManPageAndCompletions(t *testing.T) {
	r := sharedSnapshot(t, "1.0.0")
	casks := r.ofType("Homebrew Cask")
	if len(casks) != 1 {
		t.Fatalf("want one Homebrew cask, the release wrote %v", casks)
	}
	b, err := os.ReadFile(casks[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	cask := string(b)
	if !strings.Contains(cask, `cask "fluksio-worker" do`) || !strings.Contains(cask, fmt.Sprintf("version %q", r.version)) {
		t.Errorf("the cask is not fluksio-worker %s:\n%s", r.version, cask)
	}

	// Each darwin archive, by name and sum, under on_intel / on_arm.
	urls := regexp.MustCompile(`url "[^"]*/([^"/]+)"\s+sha256 "([0-9a-f]{64})"`).FindAllStringSubmatch(cask, -1)
	sums := map[string]string{}
	for _, m := range urls {
		sums[strings.ReplaceAll(m[1], "#{version}", r.version)] = m[2]
	}
	var darwin []artifact
	for _, a := range r.ofType("Archive") {
		if a.Goos == "darwin" {
			darwin = append(darwin, a)
		}
	}
	if len(darwin) != 2 {
		t.Fatalf("want the darwin amd64 and arm64 archives, have %v", darwin)
	}
	for _, a := range darwin {
		if got, want := sums[a.Name], fileSHA256(t, a.Path); got != want {
			t.Errorf("the cask gives %s sha256 %q, the archive's is %s", a.Name, got, want)
		}
	}

	// What it installs: stanza -> the archive's path.
	for stanza, path := range map[string]string{
		"binary":          "fluksio-worker",
		"manpage":         "man/fluksio-worker.1.gz",
		"bash_completion": "completions/fluksio-worker.bash",
		"zsh_completion":  "completions/_fluksio-worker",
		"fish_completion": "completions/fluksio-worker.fish",
	} {
		if !regexp.MustCompile(`(?m)^\s*` + stanza + ` "` + regexp.QuoteMeta(path) + `"$`).MatchString(cask) {
			t.Errorf("the cask has no `%s %q`:\n%s", stanza, path, cask)
		}
		for _, a := range darwin {
			if !slices.Contains(tarNames(t, a.Path), path) {
				t.Errorf("the cask's %s %s is not in %s", stanza, path, a.Name)
			}
		}
	}
	if !strings.Contains(cask, "fluksio-worker install --user-service") {
		t.Errorf("the cask's caveats do not say how to attach as a LaunchAgent:\n%s", cask)
	}
}
