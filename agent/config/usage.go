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
	best, bestDist := "", 3 // farther than 2 edits is no typo
	fs.VisitAll(func(f *flag.Flag) {
		if d := editDistance(name, f.Name); d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	if best == "" {
		return fmt.Errorf("unknown option %s", typed)
	}
	return fmt.Errorf("unknown option %s; did you mean --%s?", typed, best)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
