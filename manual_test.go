package main

// The manual page and the completions, as `fluksio-worker man` and
// `fluksio-worker completion` print them, run through the tools that read
// them (groff, bash, zsh, fish). The commands run in this process.

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// TestManualPage: `fluksio-worker man` (what the packages install as
// fluksio-worker(1)) renders without a warning and documents every command
// of --help and every option of the options table, with its variable and
// config key.
func TestManualPage(t *testing.T) {
	t.Parallel()
	groff := needShell(t, "groff", "groff")
	page := []byte(mainOutput(t, "man"))
	// -ww: every warning; -z: check only. Then as text, lines long enough
	// that no entry wraps, to read it back.
	for _, device := range []string{"utf8", "ascii"} {
		cmd := exec.Command(groff, "-man", "-T"+device, "-ww", "-z")
		cmd.Stdin = bytes.NewReader(page)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("groff -man -T%s -ww warns about the manual page (%v):\n%s", device, err, out)
		}
	}
	cmd := exec.Command(groff, "-man", "-Tascii", "-rLL=400n", "-P-cbou")
	cmd.Stdin = bytes.NewReader(page)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("groff: %v", err)
	}
	text := string(out)
	section := func(name string) string {
		_, after, ok := strings.Cut(text, "\n"+name+"\n")
		if !ok {
			t.Errorf("the manual page has no %s section:\n%s", name, text)
			return ""
		}
		return after
	}
	for _, name := range []string{"NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "OPTIONS", "ENVIRONMENT", "FILES", "SIGNALS", "EXIT STATUS", "EXAMPLES"} {
		section(name)
	}
	commands := section("COMMANDS")
	for _, name := range helpCommands(t) {
		if !regexp.MustCompile(`(?m)^   ` + name + `$`).MatchString(commands) {
			t.Errorf("the manual page has no section for the command %s", name)
		}
	}
	options := section("OPTIONS")
	for _, o := range config.Options {
		entry := "--" + o.Name + " " + o.Arg
		i := strings.Index(options, entry+"\n")
		if i < 0 {
			t.Errorf("OPTIONS does not list %s", entry)
			continue
		}
		body, _, _ := strings.Cut(options[i+len(entry)+1:], "\n\n")
		if !strings.Contains(body, "config key: "+o.Name) {
			t.Errorf("OPTIONS does not give --%s's config key:\n%s", o.Name, body)
		}
		if o.Env() != "" && !strings.Contains(body, "Variable: "+o.Env()) {
			t.Errorf("OPTIONS does not give --%s's variable %s:\n%s", o.Name, o.Env(), body)
		}
		if o.Env() != "" && !strings.Contains(section("ENVIRONMENT"), o.Env()) {
			t.Errorf("ENVIRONMENT does not list %s", o.Env())
		}
	}
	for _, want := range []string{"/etc/fluksio-worker/config.toml", "/var/lib/fluksio-worker", "/etc/systemd/system/fluksio-worker.service"} {
		if !strings.Contains(section("FILES"), want) {
			t.Errorf("FILES does not explain %s", want)
		}
	}
	for _, want := range []string{"SIGTERM", "SIGQUIT"} {
		if !strings.Contains(section("SIGNALS"), want) {
			t.Errorf("SIGNALS does not say what %s does", want)
		}
	}
}

// TestCompletions: the bash completion, sourced in a real bash, completes
// commands, flags and the values of flags that take one of a few; every
// flag it offers is one its command takes; the zsh and fish scripts parse.
func TestCompletions(t *testing.T) {
	t.Parallel()
	bash := needShell(t, "bash", "bash")
	dir := t.TempDir()
	script := filepath.Join(dir, "fluksio-worker.bash")
	writeCompletion(t, "bash", script)

	// complete returns what bash offers for the words, the last being the
	// one under the cursor.
	complete := func(words ...string) []string {
		t.Helper()
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		cmd := exec.Command(bash, "--norc", "--noprofile", "-c",
			`source "$1"; COMP_WORDS=(`+strings.Join(quoted, " ")+`); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); `+
				`COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; _fluksio_worker; printf '%s\n' "${COMPREPLY[@]}"`,
			"complete", script)
		cmd.Dir = dir // no files to offer beside the script
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("completing %q: %v\n%s", words, err, out)
		}
		return strings.Fields(string(out))
	}
	for _, c := range []struct {
		words []string
		want  []string
	}{
		{[]string{"fluksio-worker", "ins"}, []string{"install"}},
		{[]string{"fluksio-worker", "run", "--log-f"}, []string{"--log-format"}},
		{[]string{"fluksio-worker", "run", "--log-format", ""}, []string{"json", "text"}},
		{[]string{"fluksio-worker", "run", "--log-format", "=", "j"}, []string{"json"}},
		{[]string{"fluksio-worker", "--runtime", "em"}, []string{"embedded"}}, // bare flags mean run
		{[]string{"fluksio-worker", "install", "--user-s"}, []string{"--user-service"}},
		{[]string{"fluksio-worker", "completion", ""}, []string{"bash", "fish", "zsh"}},
	} {
		got := complete(c.words...)
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("completing %q gave %q, want %q", c.words, got, c.want)
		}
	}

	// Every command of --help completes, and every flag offered for it is
	// one it takes: given with --help after it, the command prints its
	// help rather than "flag provided but not defined".
	firsts := complete("fluksio-worker", "")
	for _, name := range helpCommands(t) {
		if !slices.Contains(firsts, name) {
			t.Errorf("the command %s does not complete (offered: %v)", name, firsts)
			continue
		}
		for _, flag := range complete("fluksio-worker", name, "-") {
			args := []string{name, flag, "--help"}
			if flag == "--help" {
				args = args[:2]
			} else if !strings.Contains(flag, "=") {
				args[1] += "=1" // a value every flag accepts at parse time
			}
			var out strings.Builder
			code := dispatch(context.Background(), args, &out, &out)
			if code != 0 || !strings.HasPrefix(out.String(), "Usage:") {
				t.Errorf("completion offers %s %s, but `fluksio-worker %s` says (exit %d):\n%s", name, flag, strings.Join(args, " "), code, out.String())
			}
		}
	}

	zsh := needShell(t, "zsh", "zsh")
	writeCompletion(t, "zsh", filepath.Join(dir, "_fluksio-worker"))
	if out, err := exec.Command(zsh, "-n", filepath.Join(dir, "_fluksio-worker")).CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v\n%s", err, out)
	}
	fish := needShell(t, "fish", "fish")
	writeCompletion(t, "fish", filepath.Join(dir, "fluksio-worker.fish"))
	if out, err := exec.Command(fish, "--no-execute", filepath.Join(dir, "fluksio-worker.fish")).CombinedOutput(); err != nil {
		t.Errorf("fish --no-execute: %v\n%s", err, out)
	}
}

func writeCompletion(t *testing.T, shell, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(mainOutput(t, "completion", shell)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// helpCommands are the commands `fluksio-worker --help` lists.
func helpCommands(t *testing.T) []string {
	t.Helper()
	out := mainOutput(t, "--help")
	_, list, _ := strings.Cut(out, "\nCommands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var names []string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	if len(names) < 5 {
		t.Fatalf("--help lists only %v as commands:\n%s", names, out)
	}
	return names
}

// needShell finds a program the test runs (a shell, groff): skipped
// without it, except in CI, which installs it (.ci/run).
func needShell(t *testing.T, name, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing in CI (Debian: apt-get install %s; see .ci/run)", name, debianPackage)
		}
		t.Skipf("%s not installed", name)
	}
	return path
}

// mainOutput runs a command of fluksio-worker in this process and returns
// what it printed on stdout; it must exit 0.
func mainOutput(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr strings.Builder
	if code := dispatch(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("fluksio-worker %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String()
}
