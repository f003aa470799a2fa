package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The documentation renders as written: every markdown file's code fences
// close (an unclosed one turns the rest of the page into code, and the
// links into it go nowhere), and every relative link of README.md and
// docs/*.md reaches a file of the repository and, with a #fragment, a
// heading of that page as GitHub names its anchors.

// markdownFiles are the repository's markdown files, as git knows them.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "*.md").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	files := strings.Fields(string(out))
	if len(files) == 0 {
		t.Fatal("git ls-files lists no markdown file")
	}
	return files
}

// fence is an open code fence: its character run and the line it opened on.
type fence struct {
	marker string
	line   int
}

// openingFence returns the fence a line opens (``` or ~~~, three or more,
// an info string after it), or "".
func openingFence(line string) string {
	trimmed := strings.TrimLeft(line, " \t")
	for _, c := range []string{"`", "~"} {
		if strings.HasPrefix(trimmed, c+c+c) {
			n := len(trimmed) - len(strings.TrimLeft(trimmed, c))
			if c == "`" && strings.Contains(trimmed[n:], "`") {
				return "" // an inline code span, not a fence
			}
			return trimmed[:n]
		}
	}
	return ""
}

// closesFence says whether line closes the fence opened by marker: the
// same character, at least as many, and nothing after them.
func closesFence(line, marker string) bool {
	trimmed := strings.TrimSpace(line)
	return len(trimmed) >= len(marker) && strings.Trim(trimmed, marker[:1]) == ""
}

// proseLines calls visit for each line of text outside code fences, and
// returns the fence left open at the end, if any.
func proseLines(text string, visit func(n int, line string)) *fence {
	var open *fence
	for i, line := range strings.Split(text, "\n") {
		switch {
		case open != nil:
			if closesFence(line, open.marker) {
				open = nil
			}
		case openingFence(line) != "":
			open = &fence{openingFence(line), i + 1}
		default:
			visit(i+1, line)
		}
	}
	return open
}

func TestMarkdownFencesClose(t *testing.T) {
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if open := proseLines(string(b), func(int, string) {}); open != nil {
			t.Errorf("%s:%d: the code fence %s opened here is never closed: the rest of the page renders as code", file, open.line, open.marker)
		}
	}
}

var (
	// inlineCode is a code span, whose brackets are not links.
	inlineCode = regexp.MustCompile("`[^`]*`")
	// markdownLink is [text](target) or ![alt](target), target up to a
	// space (a title may follow) or the closing parenthesis.
	markdownLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)[^)]*\)`)
	// referenceLink is a link reference definition: [name]: target.
	referenceLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	// htmlAnchor is an anchor given in HTML: id="x" or name="x".
	htmlAnchor = regexp.MustCompile(`\b(?:id|name)="([^"]+)"`)
	// headingLink is a link in a heading, which GitHub keeps the text of.
	headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// anchors are the #fragments a page has, as GitHub makes them from its
// headings (lowercased; what is not a letter, digit, space, - or _
// dropped; spaces made -; a repeated one numbered -1, -2...) and from HTML
// ids and names.
func anchors(text string) map[string]bool {
	got := map[string]bool{}
	seen := map[string]int{}
	proseLines(text, func(_ int, line string) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			got[m[1]] = true
		}
		if !strings.HasPrefix(line, "#") {
			return
		}
		heading := strings.TrimLeft(line, "#")
		if heading == "" || heading[0] != ' ' {
			return
		}
		heading = headingLink.ReplaceAllString(strings.TrimSpace(heading), "$1")
		var slug strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				slug.WriteRune(r)
			case r == ' ':
				slug.WriteByte('-')
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			got[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			got[s] = true
		}
		seen[s]++
	})
	return got
}

func TestMarkdownLinksResolve(t *testing.T) {
	files, _ := filepath.Glob("docs/*.md")
	files = append([]string{"README.md"}, files...)
	pages := map[string]map[string]bool{}
	pageAnchors := func(path string) map[string]bool {
		if pages[path] == nil {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			pages[path] = anchors(string(b))
		}
		return pages[path]
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		proseLines(string(b), func(n int, line string) {
			line = inlineCode.ReplaceAllString(line, "")
			var targets []string
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			if m := referenceLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, fragment, _ := strings.Cut(target, "#")
				if path == "" {
					path = file
				} else {
					path = filepath.Join(filepath.Dir(file), path)
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: the link %s goes nowhere: %s does not exist", file, n, target, path)
					continue
				}
				if fragment != "" && strings.HasSuffix(path, ".md") && !pageAnchors(path)[fragment] {
					t.Errorf("%s:%d: the link %s goes nowhere: %s has no heading whose anchor is #%s", file, n, target, path, fragment)
				}
			}
		})
	}
	if checked == 0 {
		t.Error("no relative link found: the link pattern no longer matches the docs")
	}
}

// The anchors GitHub gives headings, from its own pages.
func TestGitHubAnchors(t *testing.T) {
	page := "# Developing fluksio-worker\n## What runs here: code policy, signed source and call hooks\n" +
		"### `--call-memory-max` and [the disk](x.md)\n## Limits\n## Limits\n```\n# not a heading\n```\n<a id=\"kept\"></a>\n"
	got := anchors(page)
	for _, want := range []string{"developing-fluksio-worker", "what-runs-here-code-policy-signed-source-and-call-hooks",
		"--call-memory-max-and-the-disk", "limits", "limits-1", "kept"} {
		if !got[want] {
			t.Errorf("no anchor #%s; have %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a line in a code block became a heading")
	}
}

// hexWord is a word that may be a commit hash, abbreviated or whole.
var hexWord = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)

// TestDocsNameNoBuildByCommitHash: documentation names a build by what it
// is (a released version, "the build before the relay work"), not by its
// commit hash, which says nothing to a reader. A command that must build
// a commit no release names may give its hash, in a code block that says
// it is the git commit to build. A word counts as a hash when this
// repository's git resolves it to a commit (in a shallow clone, fewer do).
func TestDocsNameNoBuildByCommitHash(t *testing.T) {
	type use struct {
		file  string
		line  int
		word  string
		fence string // the code block it is in; "" in prose
	}
	var uses []*use
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var open string // the open fence's marker
		var block []*use
		var text strings.Builder
		for i, line := range strings.Split(string(b), "\n") {
			switch {
			case open != "" && closesFence(line, open):
				for _, u := range block {
					u.fence = text.String()
				}
				open, block = "", nil
				text.Reset()
				continue
			case open == "" && openingFence(line) != "":
				open = openingFence(line)
				continue
			}
			if open != "" {
				text.WriteString(line + "\n")
			}
			for _, w := range hexWord.FindAllString(line, -1) {
				if strings.ContainsAny(w, "0123456789") && strings.ContainsAny(w, "abcdef") {
					u := &use{file: file, line: i + 1, word: w}
					uses = append(uses, u)
					if open != "" {
						block = append(block, u)
					}
				}
			}
		}
	}
	if len(uses) == 0 {
		return
	}
	var query strings.Builder
	for _, u := range uses {
		query.WriteString(u.word + "^{commit}\n")
	}
	cmd := exec.Command("git", "cat-file", "--batch-check")
	cmd.Stdin = strings.NewReader(query.String())
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git cat-file --batch-check: %v", err)
	}
	answers := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(answers) != len(uses) {
		t.Fatalf("git cat-file --batch-check answered %d lines for %d words:\n%s", len(answers), len(uses), out)
	}
	for i, u := range uses {
		// "OBJECT commit SIZE" for a commit; "WORD^{commit} missing" else.
		if f := strings.Fields(answers[i]); len(f) != 3 || f[1] != "commit" {
			continue
		}
		switch {
		case u.fence == "":
			t.Errorf("%s:%d: %s is a commit hash: name the build by what it is (a released version, or what it lacks), and give a commit only in the command that builds it", u.file, u.line, u.word)
		case !strings.Contains(u.fence, "git commit"):
			t.Errorf("%s:%d: the commit hash %s in a command: the block must say it is the git commit to build (a comment naming the build)", u.file, u.line, u.word)
		}
	}
}
