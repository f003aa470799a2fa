package config

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// HelpWidth is the terminal width help text is wrapped for.
const HelpWidth = 80

// WriteOption prints one option of a command's help: the flag, then its
// explanation wrapped and indented under it.
func WriteOption(w io.Writer, flagText, help string) {
	const indent = "        "
	fmt.Fprintf(w, "  %s\n", flagText)
	line := indent
	for _, word := range strings.Fields(help) {
		if len(line)+1+len(word) > HelpWidth && line != indent {
			fmt.Fprintln(w, line)
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += word
	}
	if line != indent {
		fmt.Fprintln(w, line)
	}
}

// FlagError rewrites the flag package's error for an option fs does not
// know ("flag provided but not defined: -urll") as the user typed it, with
// the nearest known option: "unknown option --urll; did you mean --url?".
// Other errors are returned as they are.
func FlagError(fs *flag.FlagSet, args []string, err error) error {
	const undefined = "flag provided but not defined: -"
	name, ok := strings.CutPrefix(err.Error(), undefined)
	if !ok {
		return err
	}
	typed := "--" + name
	for _, a := range args {
		if a == "--" {
			break
		}
		if flagName, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && flagName == name {
			typed, _, _ = strings.Cut(a, "=")
			break
		}
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	best := Nearest(name, names)
	if best == "" {
		return fmt.Errorf("unknown option %s", typed)
	}
	return fmt.Errorf("unknown option %s; did you mean --%s?", typed, best)
}

// Nearest is the known name a mistyped one most likely meant, for a "did
// you mean" (of a flag, a command, a config key): the closest within two
// edits, "" when none is that close.
func Nearest(typed string, known []string) string {
	best, bestDist := "", 3 // farther than 2 edits is no typo
	for _, k := range known {
		if d := editDistance(typed, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// DidYouMean is "; did you mean X?" for the nearest known name (Nearest),
// "" when none is near.
func DidYouMean(typed string, known []string) string {
	if best := Nearest(typed, known); best != "" {
		return "; did you mean " + best + "?"
	}
	return ""
}

// OptionNames are the names of every option, as flags and config keys.
func OptionNames() []string {
	names := make([]string, len(Options))
	for i, o := range Options {
		names[i] = o.Name
	}
	return names
}

// editDistance is the edit distance between a and b, a swap of two
// neighbouring letters counting as one edit (optimal string alignment):
// "stauts" is one edit from status, two from start.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
