package clidoc

import (
	"regexp"
	"strings"
)

// A command's --help text is read back into blocks, so the manual can set
// it in roff and the completions can find its flags. The help texts share a
// layout (the installer's commands and agent.WriteRunUsage write them):
//
//	Usage: fluksio-worker NAME [--flag ARG]      the synopsis; more forms
//	       fluksio-worker NAME --other            indented under it
//
//	Prose starts at the first column.
//	  literal lines (examples, lists) are indented
//
//	Options:
//	  --flag ARG  [VARIABLE]                    an option: its flags at two
//	        what it does, indented further       spaces, then what it does
//	  --short X   what it does, on the same line

// help is one command's --help, read back.
type help struct {
	usage  []string // the synopsis lines, without "Usage: "
	blocks []block
}

type blockKind int

const (
	prose   blockKind = iota // lines at the first column: a paragraph
	literal                  // indented lines, kept as they are
	entry                    // an option
)

type block struct {
	kind  blockKind
	lines []string // the paragraph, the literal lines, or the option's explanation
	flags string   // entry: the flag text, e.g. "--url URL" or "--check=false"
	env   string   // entry: the variable shown in brackets after the flags
}

const usagePrefix = "Usage: "

var gap = regexp.MustCompile(`\s{2,}`)

func parseHelp(text string) help {
	var h help
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	i := 0
	if i < len(lines) && strings.HasPrefix(lines[i], usagePrefix) {
		h.usage = append(h.usage, strings.TrimSpace(lines[i][len(usagePrefix):]))
		for i++; i < len(lines) && strings.HasPrefix(lines[i], strings.Repeat(" ", len(usagePrefix))); i++ {
			h.usage = append(h.usage, strings.TrimSpace(lines[i]))
		}
	}
	var cur *block
	add := func(kind blockKind) *block {
		h.blocks = append(h.blocks, block{kind: kind})
		return &h.blocks[len(h.blocks)-1]
	}
	for ; i < len(lines); i++ {
		line := strings.TrimRight(lines[i], " ")
		switch {
		case line == "":
			cur = nil
		case !strings.HasPrefix(line, " "):
			if cur == nil || cur.kind != prose {
				cur = add(prose)
			}
			cur.lines = append(cur.lines, line)
		case strings.HasPrefix(line, "  -") && len(line) > 3 && line[3] != ' ':
			cur = add(entry)
			flags, rest, _ := strings.Cut(strings.TrimSpace(line), "  ")
			cur.flags = strings.TrimSpace(flags)
			rest = strings.TrimSpace(gap.ReplaceAllString(rest, " "))
			if strings.HasPrefix(rest, "[") && strings.HasSuffix(rest, "]") {
				cur.env = rest[1 : len(rest)-1]
			} else if rest != "" {
				cur.lines = append(cur.lines, rest)
			}
		case cur != nil && cur.kind == entry && strings.HasPrefix(line, "   "):
			cur.lines = append(cur.lines, strings.TrimSpace(line))
		default:
			if cur == nil || cur.kind != literal {
				cur = add(literal)
			}
			cur.lines = append(cur.lines, line[2:])
		}
	}
	return h
}

// flagRE finds a flag in an option's flag text or a synopsis, with the
// placeholder that follows it, if any: "--url URL", "--runtime
// auto|embedded|PATH", "--check=false", "[--purge]".
var flagRE = regexp.MustCompile(`--([a-z][a-z0-9-]*)(=[a-z]+)?(?: ([A-Z][A-Z0-9_]*(?:[|,][A-Za-z0-9_]+)*|[a-z]+(?:\|[A-Za-z]+)+))?`)

// flagsIn returns the flags a piece of help names.
func flagsIn(text string) []flagSpec {
	var out []flagSpec
	for _, m := range flagRE.FindAllStringSubmatch(text, -1) {
		f := flagSpec{Name: m[1], Literal: m[2], Arg: m[3]}
		out = append(out, f)
	}
	return out
}

// argWords are the fixed words a command takes, read off its synopsis:
// "fluksio-worker completion bash|zsh|fish" takes bash, zsh or fish.
func argWords(usage []string) []string {
	word := regexp.MustCompile(`^[a-z]+(\|[a-z]+)+$`)
	for _, line := range usage {
		for _, field := range strings.Fields(line) {
			if word.MatchString(field) {
				return strings.Split(field, "|")
			}
		}
	}
	return nil
}

// paragraph joins prose lines into one line of text.
func paragraph(lines []string) string {
	return strings.Join(strings.Fields(strings.Join(lines, " ")), " ")
}
