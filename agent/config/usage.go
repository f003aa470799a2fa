package config

import (
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
