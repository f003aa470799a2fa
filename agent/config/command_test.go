package config

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

// A command's command line, as every command reads it: --help is the help
// on stdout and 0; a mistyped option, a missing value and a stray argument
// are one line on stderr, in the user's words, and 2.
func TestCommandParseAndAnswer(t *testing.T) {
	newCmd := func() (*Command, *string) {
		cmd := NewCommand("demo", HelpText("Usage: fluksio-worker demo [--out PATH]\n"))
		return cmd, cmd.String("out", "x", "")
	}
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--help"}, ExitOK, "Usage: fluksio-worker demo [--out PATH]\n", ""},
		{[]string{"-h"}, ExitOK, "Usage: fluksio-worker demo [--out PATH]\n", ""},
		{[]string{"--ouy=p"}, ExitUsage, "", "fluksio-worker: unknown option --ouy; did you mean --out? (see 'fluksio-worker demo --help')\n"},
		{[]string{"--frobnicate"}, ExitUsage, "", "fluksio-worker: unknown option --frobnicate (see 'fluksio-worker demo --help')\n"},
		{[]string{"--out"}, ExitUsage, "", "fluksio-worker: flag needs an argument: -out (see 'fluksio-worker demo --help')\n"},
		{[]string{"--out", "p", "stray"}, ExitUsage, "", "fluksio-worker: unexpected argument \"stray\" (see 'fluksio-worker demo --help')\n"},
	} {
		cmd, _ := newCmd()
		err := cmd.Parse(tc.args)
		if err == nil {
			t.Errorf("%q: parsed", tc.args)
			continue
		}
		var stdout, stderr strings.Builder
		if code := cmd.Answer(err, &stdout, &stderr); code != tc.code || stdout.String() != tc.stdout || stderr.String() != tc.stderr {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
		var usage *UsageError
		if !errors.Is(err, flag.ErrHelp) && !errors.As(err, &usage) {
			t.Errorf("%q: %T, want a *UsageError", tc.args, err)
		}
	}

	// Given tells a flag given its default from one left at it.
	cmd, out := newCmd()
	if err := cmd.Parse([]string{"--out", "x"}); err != nil || *out != "x" || !cmd.Given("out") {
		t.Errorf("--out x: %v, %q, given %v", err, *out, cmd.Given("out"))
	}
	if cmd, _ := newCmd(); cmd.Parse(nil) != nil || cmd.Given("out") {
		t.Error("no --out: given")
	}

	// A command that takes arguments gets them to judge.
	cmd, _ = newCmd()
	cmd.Operands = true
	if err := cmd.Parse([]string{"--out", "p", "a.py", "b.py"}); err != nil || strings.Join(cmd.Args(), " ") != "a.py b.py" {
		t.Errorf("with operands: %v, %q", err, cmd.Args())
	}

	// An error of the command's own is said the same way.
	if code := cmd.Answer(Usagef("give the token once"), io.Discard, io.Discard); code != ExitUsage {
		t.Errorf("a usage error of its own: exit %d", code)
	}
}
