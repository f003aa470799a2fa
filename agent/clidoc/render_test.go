package clidoc_test

// The manual page and the completions of a small command line, read back
// by the tools that use them: groff, bash, zsh and fish. (The root
// package's manual_test.go checks the real command line the same way.)

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/clidoc"
	"github.com/fluksio/fluksio-worker/agent/config"
)

// smallCLI is run, with its real help and options table, and one more
// command with a flag of a few values and a positional argument.
func smallCLI() clidoc.CLI {
	var run bytes.Buffer
	agent.WriteRunUsage(&run)
	return clidoc.CLI{
		Program:      "fluksio-worker",
		Version:      "1.2.3",
		Date:         time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC),
		Tagline:      "run nodes for a remote engine",
		About:        "It runs nodes.",
		Synopsis:     []string{"[run] --url URL [options]", "COMMAND [options]"},
		Examples:     [][2]string{{"fluksio-worker selftest", "check this machine"}},
		TableCommand: "run",
		Options:      config.Options,
		Commands: []clidoc.Command{
			{Name: "run", Summary: "attach and run calls", Help: run.String()},
			{Name: "paint", Summary: "paint a file", Help: `Usage: fluksio-worker paint [--colour red|green] [--dry-run] FILE

Paints FILE.

Options:
  --colour red|green
        the colour (default red)
  --dry-run
        say what would be painted
`},
		},
	}
}

func need(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing in CI (see .ci/run)", name)
		}
		t.Skipf("%s not installed", name)
	}
	return path
}

func TestManualPageRenders(t *testing.T) {
	var page bytes.Buffer
	files := []clidoc.File{{Path: "/etc/fluksio-worker/config.toml", What: "the configuration"}}
	if err := clidoc.WriteMan(&page, smallCLI(), files); err != nil {
		t.Fatal(err)
	}
	groff := need(t, "groff")
	check := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
	check.Stdin = bytes.NewReader(page.Bytes())
	if out, err := check.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("groff warns (%v):\n%s", err, out)
	}
	render := exec.Command(groff, "-man", "-Tascii", "-rLL=400n", "-P-cbou")
	render.Stdin = bytes.NewReader(page.Bytes())
	out, err := render.Output()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, want := range []string{"NAME", "fluksio-worker - run nodes for a remote engine", "COMMANDS", "paint",
		"--colour red|green", "OPTIONS", "--url URL", "Variable: FLUKSIO_WORKER_URL", "config key: url",
		"ENVIRONMENT", "FILES", "/etc/fluksio-worker/config.toml", "the configuration", "EXAMPLES", "Check this machine", "1.2.3"} {
		if !strings.Contains(text, want) {
			t.Errorf("the rendered page lacks %q:\n%s", want, text)
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	c := smallCLI()
	dir := t.TempDir()
	write := func(shell, name string) string {
		var b bytes.Buffer
		if err := clidoc.WriteCompletion(&b, c, shell); err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		path := filepath.Join(dir, name)
		os.WriteFile(path, b.Bytes(), 0o644)
		return path
	}
	bash := need(t, "bash")
	script := write("bash", "c.bash")
	complete := func(words ...string) []string {
		t.Helper()
		args := append([]string{"--norc", "--noprofile", "-c",
			`source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); ` +
				`COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; _fluksio_worker; printf '%s\n' "${COMPREPLY[@]}"`,
			"complete", script}, words...)
		cmd := exec.Command(bash, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("completing %q: %v\n%s", words, err, out)
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		return got
	}
	for _, tc := range []struct {
		words, want []string
	}{
		{[]string{"fluksio-worker", "pa"}, []string{"paint"}},
		{[]string{"fluksio-worker", "paint", "--col"}, []string{"--colour"}},
		{[]string{"fluksio-worker", "paint", "--colour", ""}, []string{"green", "red"}},
		{[]string{"fluksio-worker", "paint", "--d"}, []string{"--dry-run"}},
		{[]string{"fluksio-worker", "--log-format", ""}, []string{"json", "text"}}, // bare flags mean run
	} {
		if got := complete(tc.words...); !slices.Equal(got, tc.want) {
			t.Errorf("completing %q gave %q, want %q", tc.words, got, tc.want)
		}
	}
	if out, err := exec.Command(need(t, "zsh"), "-n", write("zsh", "_fluksio-worker")).CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v\n%s", err, out)
	}
	if out, err := exec.Command(need(t, "fish"), "--no-execute", write("fish", "c.fish")).CombinedOutput(); err != nil {
		t.Errorf("fish --no-execute: %v\n%s", err, out)
	}
	var b bytes.Buffer
	if err := clidoc.WriteCompletion(&b, c, "tcsh"); err == nil {
		t.Error("a completion for tcsh was written")
	}
	c.TableCommand = "missing"
	if err := clidoc.WriteCompletion(&b, c, "bash"); err == nil {
		t.Error("a command line without its table command was completed")
	}
}
