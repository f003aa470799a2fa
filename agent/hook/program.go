package hook

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// interpreters are the programs whose first argument that is not an
// option is the script they run: for `sh /etc/x.sh` or `python3 x.py` that
// script decides what runs as much as the interpreter does. Each maps to
// its options after which no script file follows (sh -c 'command',
// python3 -m module, perl -e 'code').
var interpreters = map[string]string{"sh": "-c", "bash": "-c", "dash": "-c", "zsh": "-c", "python": "-c -m", "python3": "-c -m", "perl": "-e -E"}

// Programs are the files a hook command runs, as /bin/sh would find them,
// for the worker to check at start that only root or its own user may
// change them: the command's first program (quotes removed, variable
// assignments before it skipped; a word without a slash found on PATH),
// and, when that is a shell or an interpreter, the script it is given.
// A shell builtin, a word the shell would expand ($HOOK, *) and what
// follows the first ;, |, & or redirection are not followed.
func Programs(command string) []string {
	words := leadingWords(command)
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "=") {
		words = words[1:] // FOO=1 prog: an assignment for prog
	}
	if len(words) == 0 || strings.ContainsAny(words[0], "$`*?[~") {
		return nil
	}
	var out []string
	first := words[0]
	if !strings.Contains(first, "/") {
		found, err := exec.LookPath(first)
		if err != nil {
			return nil // a builtin (exit, echo in some shells) or not there: the hook says so when it runs
		}
		first = found
	}
	out = append(out, first)
	if noScript, ok := interpreters[filepath.Base(words[0])]; ok {
		for _, w := range words[1:] {
			if strings.HasPrefix(w, "-") {
				if slices.Contains(strings.Fields(noScript), w) {
					break
				}
				continue
			}
			if !strings.ContainsAny(w, "$`*?[~") {
				out = append(out, w)
			}
			break
		}
	}
	return out
}

// leadingWords splits command into words up to its first unquoted ;, |,
// &, <, >, ( or ) or newline, with single and double quotes removed.
func leadingWords(command string) []string {
	var words []string
	var word strings.Builder
	inWord := false
	var quote rune
	for _, r := range command {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				word.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words, inWord = append(words, word.String()), false
				word.Reset()
			}
		case strings.ContainsRune(";|&<>()\n", r):
			if inWord {
				words = append(words, word.String())
			}
			return words
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}
