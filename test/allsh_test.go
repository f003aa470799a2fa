package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// test/all.sh's step runner (test/steps.sh, which all.sh sources), run
// with steps of its own: a failing step, a failing pipeline and a passing
// step after them. Every step runs and prints, the end lists the failed
// ones, and the run exits 1; with no failure it exits 0.
func TestAllShStepsRunPastAFailure(t *testing.T) {
	t.Parallel()
	steps := filepath.Join(moduleRoot(t), "test", "steps.sh")
	run := func(script string) (string, int) {
		t.Helper()
		cmd := exec.Command("bash", "-c", "set -uo pipefail\n. \"$1\"\n"+script, "bash", steps)
		out, err := cmd.CombinedOutput()
		code := cmd.ProcessState.ExitCode()
		if err != nil && code <= 0 {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return string(out), code
	}

	out, code := run(`
fails() { echo "first ran"; return 3; }
step first fails
piped() { false | cat; }
step "a pipeline" piped
step last echo "last ran"
finish
echo "not reached: finish exits"
`)
	if code != 1 {
		t.Errorf("exit status %d with failed steps; want 1\n%s", code, out)
	}
	for _, want := range []string{
		"== first\nfirst ran\n== first: FAILED",
		"== a pipeline\n== a pipeline: FAILED",
		"== last\nlast ran\n",
		"== FAILED: 2 step(s), each above:\n  first\n  a pipeline\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not reached") || strings.Contains(out, "  last\n") {
		t.Errorf("finish did not end the run, or listed a step that passed:\n%s", out)
	}

	out, code = run("step only true\nfinish\n")
	if code != 0 || !strings.Contains(out, "== every step passed") {
		t.Errorf("exit status %d with every step passing; want 0 and a line saying so:\n%s", code, out)
	}
}

// test/all.sh itself, read: every step through the runner and nothing
// that ends the run early (set -e, exit) but finish; its temporary
// directory removed on any exit; each fuzzer run for a number of inputs,
// never until a deadline (go.dev/issue/75804 fails a run at a -fuzztime
// deadline with no failing input).
func TestAllShShape(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "test", "all.sh"))
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	code := regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(script, "")
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^set -[a-z]*e`),
		regexp.MustCompile(`(?m)(^|[;&|{(])\s*exit\b`),
		regexp.MustCompile(`-fuzztime +"?[0-9]+[smh]`),
	} {
		if loc := bad.FindStringIndex(code); loc != nil {
			t.Errorf("test/all.sh has %q: a step's failure must not end the run, and the fuzzers run for a count (-fuzztime Nx)", code[loc[0]:loc[1]])
		}
	}
	for _, want := range []string{". test/steps.sh", `trap 'rm -rf "$logs"' EXIT`, `-fuzztime "${inputs}x"`, "\nfinish\n"} {
		if !strings.Contains(script, want) {
			t.Errorf("test/all.sh lacks %q", want)
		}
	}
}
