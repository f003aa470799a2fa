package clidoc

import (
	"slices"
	"testing"
)

// The layouts the commands' help texts use, read back.
func TestParseHelp(t *testing.T) {
	h := parseHelp(`Usage: fluksio-worker thing [--fast] [--out FILE]
       fluksio-worker thing --other

Does a thing:
  1. first
     (continued)

Options:
  --out FILE  [FLUKSIO_WORKER_OUT]
        where it goes,
        wrapped
  --fast       no waiting
  --url, --token-file, … 
        any option of run

Exit status: 0 done, 2 bad options.
`)
	if want := []string{"fluksio-worker thing [--fast] [--out FILE]", "fluksio-worker thing --other"}; !slices.Equal(h.usage, want) {
		t.Errorf("usage %q, want %q", h.usage, want)
	}
	kinds := []blockKind{prose, literal, prose, entry, entry, entry, prose}
	if len(h.blocks) != len(kinds) {
		t.Fatalf("%d blocks, want %d: %+v", len(h.blocks), len(kinds), h.blocks)
	}
	for i, k := range kinds {
		if h.blocks[i].kind != k {
			t.Errorf("block %d is %v, want %v: %+v", i, h.blocks[i].kind, k, h.blocks[i])
		}
	}
	out := h.blocks[3]
	if out.flags != "--out FILE" || out.env != "FLUKSIO_WORKER_OUT" || paragraph(out.lines) != "where it goes, wrapped" {
		t.Errorf("--out read as %+v", out)
	}
	if fast := h.blocks[4]; fast.flags != "--fast" || paragraph(fast.lines) != "no waiting" {
		t.Errorf("--fast read as %+v", fast)
	}
	if got := h.blocks[1].lines; !slices.Equal(got, []string{"1. first", "   (continued)"}) {
		t.Errorf("the list read as %q", got)
	}
	var names []string
	for _, f := range flagsIn(h.blocks[5].flags) {
		names = append(names, f.Name)
	}
	if !slices.Equal(names, []string{"url", "token-file"}) {
		t.Errorf("flags of %q: %v", h.blocks[5].flags, names)
	}
}

func TestFlagsIn(t *testing.T) {
	for text, want := range map[string]flagSpec{
		"--runtime auto|embedded|PATH": {Name: "runtime", Arg: "auto|embedded|PATH"},
		"--check=false":                {Name: "check", Literal: "=false"},
		"[--labels A,B]":               {Name: "labels", Arg: "A,B"},
		"--token -":                    {Name: "token"},
		"--verbose":                    {Name: "verbose"},
	} {
		got := flagsIn(text)
		if len(got) != 1 || got[0] != want {
			t.Errorf("flagsIn(%q) = %+v, want %+v", text, got, want)
		}
	}
	if got := argWords([]string{"fluksio-worker completion bash|zsh|fish"}); !slices.Equal(got, []string{"bash", "zsh", "fish"}) {
		t.Errorf("argWords: %v", got)
	}
}

// What a person types keeps its minus signs and straight quotes; prose
// keeps its hyphens; nothing starts a line as a request.
func TestRoffEscapes(t *testing.T) {
	for in, want := range map[string]string{
		"comma-separated, see --token-file": `comma-separated, see \-\-token\-file`,
		".hidden and 'quoted'":              `\&.hidden and 'quoted'`,
		`C:\path`:                           `C:\epath`,
		"one of a few …":                    "one of a few ...",
	} {
		if got := text(in); got != want {
			t.Errorf("text(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := code("echo 'a' --x-y"), `echo \(aqa\(aq \-\-x\-y`; got != want {
		t.Errorf("code: %q, want %q", got, want)
	}
	if got, want := flagText("--url, --token-file, …"), `\fB\-\-url\fR, \fB\-\-token\-file\fR, \&...`; got != want {
		t.Errorf("flagText: %q, want %q", got, want)
	}
}
