package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The distributions' own linters, run on the snapshot packages as an
// administrator would before installing them. What they report and is
// right for this package is overridden with a reason where they look for
// it: packaging/lintian-overrides (the deb installs it) and
// packaging/rpmlint.toml. Any other error or warning fails the test.

// lintDeb runs lintian on each deb.
func lintDeb(t *testing.T, root string, r release) {
	needLinter(t, "lintian")
	for _, goarch := range []string{"amd64", "arm64"} {
		deb := r.pkg(t, "deb", goarch)
		cmd := exec.Command("lintian", "--fail-on", "error,warning", deb)
		out, err := cmd.CombinedOutput()
		findings := linterFindings(string(out), regexp.MustCompile(`^[EW]: `))
		if err != nil || len(findings) > 0 {
			t.Errorf("lintian %s: %v; findings without an override (fix them, or override them with a reason in packaging/lintian-overrides):\n%s\n\nfull output:\n%s",
				filepath.Base(deb), err, strings.Join(findings, "\n"), out)
		}
	}
}

// lintRPM runs rpmlint on each rpm, with the project's settings and
// filters.
func lintRPM(t *testing.T, root string, r release) {
	needLinter(t, "rpmlint")
	path := safeCpio(t)
	for _, goarch := range []string{"amd64", "arm64"} {
		rpm := r.pkg(t, "rpm", goarch)
		cmd := exec.Command("rpmlint", "-c", filepath.Join(root, "packaging", "rpmlint.toml"), rpm)
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		findings := linterFindings(string(out), regexp.MustCompile(`: [EW]: `))
		if err != nil || len(findings) > 0 {
			t.Errorf("rpmlint %s: %v; findings not filtered (fix them, or filter them with a reason in packaging/rpmlint.toml):\n%s\n\nfull output:\n%s",
				filepath.Base(rpm), err, strings.Join(findings, "\n"), out)
		}
		if !strings.Contains(string(out), "1 packages and 0 specfiles checked") {
			t.Errorf("rpmlint %s checked nothing:\n%s", filepath.Base(rpm), out)
		}
	}
}

// safeCpio returns a PATH whose cpio keeps rpmlint's extraction inside its
// temporary directory. rpmlint 2.4 unpacks with `rpm2cpio | cpio -id`, and
// nFPM's rpm names its files /usr/..., which GNU cpio would write to this
// machine's /usr (as root, over whatever is there) while rpmlint, finding
// nothing in its directory, would check no file's content.
func safeCpio(t *testing.T) string {
	t.Helper()
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Fatalf("rpmlint needs cpio: %v", err)
	}
	dir := t.TempDir()
	wrapper := "#!/bin/sh\nexec " + cpio + " --no-absolute-filenames \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "cpio"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir + string(os.PathListSeparator) + os.Getenv("PATH")
}

// linterFindings are the lines of a linter's output that are findings.
func linterFindings(out string, finding *regexp.Regexp) []string {
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		if finding.MatchString(line) {
			lines = append(lines, line)
		}
	}
	return lines
}

// needLinter skips without the linter, except in CI, which installs it
// (.ci/run).
func needLinter(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing in CI (Debian: apt-get install %s; see .ci/run)", name, name)
		}
		t.Skipf("%s not installed", name)
	}
}
