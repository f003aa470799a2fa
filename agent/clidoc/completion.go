package clidoc

import (
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Shells are the shells WriteCompletion writes for.
var Shells = []string{"bash", "zsh", "fish"}

// flagSpec is a flag as a completion offers it.
type flagSpec struct {
	Name    string // without the dashes
	Literal string // "=false": offered whole, as --check=false
	Arg     string // its placeholder; "" for a flag that takes no value
	Help    string
}

// word is what the completion inserts.
func (f flagSpec) word() string { return "--" + f.Name + f.Literal }

// values are the fixed values a placeholder lists: "text|json", or the
// lower-case ones of "auto|embedded|PATH".
func (f flagSpec) values() []string {
	if !strings.Contains(f.Arg, "|") {
		return nil
	}
	var out []string
	for _, v := range strings.Split(f.Arg, "|") {
		if v == strings.ToLower(v) {
			out = append(out, v)
		}
	}
	return out
}

// pathArg says whether the value is a file (or, for DIR, a directory):
// the placeholder says so, alone or as one of a set ("auto|embedded|PATH").
func (f flagSpec) pathArg() (file, dir bool) {
	for _, v := range strings.Split(f.Arg, "|") {
		switch v {
		case "PATH", "FILE":
			file = true
		case "DIR":
			dir = true
		}
	}
	return file, dir
}

// cmdSpec is a command as a completion offers it.
type cmdSpec struct {
	Name    string
	Summary string
	Flags   []flagSpec
	Args    []string // fixed words it takes
}

// completionModel reads the commands and their flags off the help texts
// and the table.
func (c CLI) completionModel() (cmds []cmdSpec, runFlags []flagSpec) {
	for _, cmd := range c.Commands {
		h := parseHelp(cmd.Help)
		var flags []flagSpec
		add := func(f flagSpec) {
			for i := range flags {
				if flags[i].Name == f.Name {
					// The first mention keeps its place; a later one fills in
					// what it lacked ("[--purge]" in the synopsis, then the
					// entry that explains it).
					if flags[i].Arg == "" && flags[i].Literal == "" {
						flags[i].Arg = f.Arg
					}
					if flags[i].Help == "" {
						flags[i].Help = f.Help
					}
					return
				}
			}
			flags = append(flags, f)
		}
		for _, b := range h.blocks {
			if b.kind != entry {
				continue
			}
			fs := flagsIn(b.flags)
			for _, f := range fs {
				if len(fs) == 1 { // "--url, --token-file, …" explains no single flag
					f.Help = paragraph(b.lines)
				}
				add(f)
			}
		}
		for _, f := range flagsIn(strings.Join(h.usage, " ")) {
			add(f)
		}
		if cmd.TakesTable || cmd.Name == c.TableCommand {
			for _, o := range c.Options {
				add(flagSpec{Name: o.Name, Arg: o.Arg, Help: o.Help})
			}
		}
		add(flagSpec{Name: "help", Help: "show this command's help"})
		spec := cmdSpec{Name: cmd.Name, Summary: cmd.Summary, Flags: flags, Args: argWords(h.usage)}
		cmds = append(cmds, spec)
		if cmd.Name == c.TableCommand {
			runFlags = flags
		}
	}
	return cmds, runFlags
}

// safeWord is what may appear unquoted in a script: command, flag and
// value names.
var safeWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._=-]*$`)

// WriteCompletion writes the completion script for shell (bash, zsh or
// fish).
func WriteCompletion(w io.Writer, c CLI, shell string) error {
	cmds, runFlags := c.completionModel()
	if runFlags == nil {
		return fmt.Errorf("the command list has no %q, whose flags a bare flag means", c.TableCommand)
	}
	for _, cmd := range cmds {
		words := append([]string{cmd.Name}, cmd.Args...)
		for _, f := range cmd.Flags {
			words = append(words, f.Name+f.Literal)
			words = append(words, f.values()...)
		}
		for _, word := range words {
			if !safeWord.MatchString(word) {
				return fmt.Errorf("command %s: %q cannot be completed safely", cmd.Name, word)
			}
		}
	}
	s := script{c: c, cmds: cmds, run: runFlags}
	switch shell {
	case "bash":
		s.bash()
	case "zsh":
		s.zsh()
	case "fish":
		s.fish()
	default:
		return fmt.Errorf("no completion for %q: the shells are %s", shell, strings.Join(Shells, ", "))
	}
	_, err := io.WriteString(w, s.b.String())
	return err
}

type script struct {
	c    CLI
	cmds []cmdSpec
	run  []flagSpec
	b    strings.Builder
}

func (s *script) p(format string, args ...any) { fmt.Fprintf(&s.b, format+"\n", args...) }

// topWords are the words at the first position besides the commands.
var topWords = []string{"help", "version"}

// short cuts a help text to a line a completion menu can show.
func short(help string) string {
	for _, stop := range []string{". ", "; ", " (", ", e.g."} {
		if i := strings.Index(help, stop); i > 0 {
			help = help[:i]
		}
	}
	help = strings.TrimSuffix(strings.TrimSpace(help), ".")
	if len(help) > 70 {
		cut := strings.LastIndex(help[:70], " ")
		help = help[:cut] + "…"
	}
	return help
}

func flagWords(fs []flagSpec) string {
	var words []string
	for _, f := range fs {
		words = append(words, f.word())
	}
	return strings.Join(words, " ")
}

// bash: a function for `complete -F`, self-contained (it needs neither the
// bash-completion package's helpers nor a particular version of them).
func (s *script) bash() {
	fn := "_" + strings.ReplaceAll(s.c.Program, "-", "_")
	var names []string
	for _, cmd := range s.cmds {
		names = append(names, cmd.Name)
	}
	s.p("# bash completion for %s, generated by '%s completion bash'", s.c.Program, s.c.Program)
	s.p("# from its commands and options (%s); do not edit.", s.c.Version)
	s.p("")
	s.p("%s() {", fn)
	s.p(`    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd`)
	s.p(`    # --flag=value: bash splits the word at '=' (it is in COMP_WORDBREAKS)`)
	s.p(`    if [[ $cur == = ]]; then`)
	s.p(`        cur=`)
	s.p(`    elif [[ $prev == = ]] && (( COMP_CWORD > 1 )); then`)
	s.p(`        prev=${COMP_WORDS[COMP_CWORD-2]}`)
	s.p(`    fi`)
	s.p(`    COMPREPLY=()`)
	s.p(`    if (( COMP_CWORD == 1 )) && [[ $cur != -* ]]; then`)
	s.p(`        COMPREPLY=($(compgen -W '%s' -- "$cur"))`, strings.Join(append(names, topWords...), " "))
	s.p(`        return`)
	s.p(`    fi`)
	s.p(`    cmd=${COMP_WORDS[1]}`)
	s.p(`    # bare flags mean %s`, s.c.TableCommand)
	s.p(`    [[ $cmd == -* ]] && cmd=%s`, s.c.TableCommand)
	s.p(`    case $cmd in`)
	for _, cmd := range s.cmds {
		flags := cmd.Flags
		s.p(`    %s)`, cmd.Name)
		s.bashValues(flags)
		if len(cmd.Args) > 0 {
			s.p(`        if [[ $cur != -* ]]; then`)
			s.p(`            COMPREPLY=($(compgen -W '%s' -- "$cur"))`, strings.Join(cmd.Args, " "))
			s.p(`            return`)
			s.p(`        fi`)
		}
		s.p(`        COMPREPLY=($(compgen -W '%s' -- "$cur"))`, flagWords(flags))
		s.p(`        ;;`)
	}
	s.p(`    esac`)
	s.p(`}`)
	s.p(`complete -F %s %s`, fn, s.c.Program)
}

// bashValues completes the value of the flag before the cursor.
func (s *script) bashValues(flags []flagSpec) {
	var files, dirs, free []string
	var fixed []flagSpec
	for _, f := range flags {
		if f.Arg == "" {
			continue
		}
		file, dir := f.pathArg()
		switch {
		case len(f.values()) > 0:
			fixed = append(fixed, f)
		case file:
			files = append(files, f.word())
		case dir:
			dirs = append(dirs, f.word())
		default:
			free = append(free, f.word())
		}
	}
	if len(fixed)+len(files)+len(dirs)+len(free) == 0 {
		return
	}
	s.p(`        case $prev in`)
	for _, f := range fixed {
		s.p(`        %s)`, f.word())
		s.p(`            COMPREPLY=($(compgen -W '%s' -- "$cur"))`, strings.Join(f.values(), " "))
		if file, _ := f.pathArg(); file {
			s.p(`            compopt -o filenames 2>/dev/null`)
			s.p(`            COMPREPLY+=($(compgen -f -- "$cur"))`)
		}
		s.p(`            return ;;`)
	}
	if len(files) > 0 {
		s.p(`        %s)`, strings.Join(files, "|"))
		s.p(`            compopt -o filenames 2>/dev/null`)
		s.p(`            COMPREPLY=($(compgen -f -- "$cur"))`)
		s.p(`            return ;;`)
	}
	if len(dirs) > 0 {
		s.p(`        %s)`, strings.Join(dirs, "|"))
		s.p(`            compopt -o filenames 2>/dev/null`)
		s.p(`            COMPREPLY=($(compgen -d -- "$cur"))`)
		s.p(`            return ;;`)
	}
	if len(free) > 0 {
		s.p(`        %s)`, strings.Join(free, "|"))
		s.p(`            return ;; # a value only the user knows`)
	}
	s.p(`        esac`)
}

// zsh: an autoloadable #compdef function that also works when sourced.
func (s *script) zsh() {
	fn := "_" + s.c.Program
	s.p("#compdef %s", s.c.Program)
	s.p("# zsh completion for %s, generated by '%s completion zsh'", s.c.Program, s.c.Program)
	s.p("# from its commands and options (%s); do not edit.", s.c.Version)
	s.p("")
	s.p("%s() {", fn)
	s.p(`    local -a commands`)
	s.p(`    commands=(`)
	for _, cmd := range s.cmds {
		s.p(`        %s`, zshQuote(cmd.Name+":"+strings.ReplaceAll(cmd.Summary, ":", `\:`)))
	}
	s.p(`        'help:show the commands'`)
	s.p(`        'version:print the version'`)
	s.p(`    )`)
	s.p(`    local cmd=${words[2]}`)
	s.p(`    if (( CURRENT == 2 )) && [[ ${words[CURRENT]} != -* ]]; then`)
	s.p(`        _describe -t commands '%s command' commands`, s.c.Program)
	s.p(`        return`)
	s.p(`    fi`)
	s.p(`    if [[ $cmd == -* ]]; then`)
	s.p(`        cmd=%s # bare flags mean %s`, s.c.TableCommand, s.c.TableCommand)
	s.p(`    else`)
	s.p(`        shift words`)
	s.p(`        (( CURRENT-- ))`)
	s.p(`    fi`)
	s.p(`    case $cmd in`)
	for _, cmd := range s.cmds {
		flags := cmd.Flags
		s.p(`    %s)`, cmd.Name)
		s.p(`        _arguments -S \`)
		for _, f := range flags {
			s.p(`            %s \`, zshQuote(zshSpec(f)))
		}
		if len(cmd.Args) > 0 {
			s.p(`            %s \`, zshQuote("1:"+cmd.Name+":("+strings.Join(cmd.Args, " ")+")"))
		}
		s.p(`            && return 0`)
		s.p(`        ;;`)
	}
	s.p(`    esac`)
	s.p(`    return 1`)
	s.p(`}`)
	s.p(``)
	s.p(`if [[ ${funcstack[1]} == %s ]]; then`, fn)
	s.p(`    %s "$@"`, fn)
	s.p(`else`)
	s.p(`    compdef %s %s`, fn, s.c.Program)
	s.p(`fi`)
}

// zshSpec is one _arguments spec: --flag=[help]:placeholder:action.
func zshSpec(f flagSpec) string {
	desc := "[" + zshEscape(short(f.Help)) + "]"
	if f.Literal != "" {
		return "--" + f.Name + strings.ReplaceAll(f.Literal, "=", `\=`) + desc
	}
	if f.Arg == "" {
		return "--" + f.Name + desc
	}
	action := " "
	file, dir := f.pathArg()
	switch {
	case len(f.values()) > 0 && file:
		action = "{compadd -- " + strings.Join(f.values(), " ") + "; _files}"
	case len(f.values()) > 0:
		action = "(" + strings.Join(f.values(), " ") + ")"
	case file:
		action = "_files"
	case dir:
		action = "_files -/"
	}
	return "--" + f.Name + "=" + desc + ":" + zshEscape(f.Arg) + ":" + action
}

// zshEscape escapes what _arguments reads specially in a description.
func zshEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `[`, `\[`, `]`, `\]`, `:`, `\:`).Replace(s)
}

// zshQuote single-quotes a word for zsh (and for sh).
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// fish: one `complete` line per command and per flag.
func (s *script) fish() {
	p := s.c.Program
	fn := "__" + strings.ReplaceAll(p, "-", "_")
	s.p("# fish completion for %s, generated by '%s completion fish'", p, p)
	s.p("# from its commands and options (%s); do not edit.", s.c.Version)
	s.p("")
	s.p(`# The command being completed: the first word after the program, or %s`, s.c.TableCommand)
	s.p(`# when there is none yet or it is a flag (bare flags mean %s).`, s.c.TableCommand)
	s.p(`function %s_command`, fn)
	s.p(`    set -l words (commandline -opc)`)
	s.p(`    if test (count $words) -lt 2; or string match -q -- '-*' $words[2]`)
	s.p(`        echo %s`, s.c.TableCommand)
	s.p(`    else`)
	s.p(`        echo $words[2]`)
	s.p(`    end`)
	s.p(`end`)
	s.p(`function %s_at_command`, fn)
	s.p(`    test (count (commandline -opc)) -eq 1`)
	s.p(`end`)
	s.p(`function %s_using`, fn)
	s.p(`    test (%s_command) = $argv[1]`, fn)
	s.p(`end`)
	s.p(``)
	s.p(`complete -c %s -f`, p)
	for _, cmd := range s.cmds {
		s.p(`complete -c %s -n %s_at_command -a %s -d %s`, p, fn, cmd.Name, fishQuote(cmd.Summary))
	}
	for _, w := range topWords {
		s.p(`complete -c %s -n %s_at_command -a %s`, p, fn, w)
	}
	for _, cmd := range s.cmds {
		s.p(``)
		cond := fishQuote(fn + "_using " + cmd.Name)
		for _, f := range cmd.Flags {
			line := fmt.Sprintf(`complete -c %s -n %s`, p, cond)
			if f.Literal != "" {
				line += " -a " + fishQuote(f.word())
			} else {
				line += " -l " + f.Name
			}
			file, dir := f.pathArg()
			switch {
			case f.Arg == "" || f.Literal != "":
			case len(f.values()) > 0 && file:
				line += " -r -F -a " + fishQuote(strings.Join(f.values(), " "))
			case len(f.values()) > 0:
				line += " -x -a " + fishQuote(strings.Join(f.values(), " "))
			case file:
				line += " -r -F"
			case dir:
				line += " -x -a '(__fish_complete_directories)'"
			default:
				line += " -x"
			}
			if f.Help != "" {
				line += " -d " + fishQuote(short(f.Help))
			}
			s.p("%s", line)
		}
		if len(cmd.Args) > 0 {
			s.p(`complete -c %s -n %s -a %s`, p, cond, fishQuote(strings.Join(cmd.Args, " ")))
		}
	}
}

// fishQuote single-quotes a word for fish, which escapes \ and ' inside.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
