package clidoc

import (
	"fmt"
	"io"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// WriteOptionsTable writes the README's table of run's options, in
// Markdown: each option's flag, its variable and what it does, with its
// default. The README holds it between markers that a test keeps in step
// with the table (README.md, `go test -run TestREADME . -update`).
func WriteOptionsTable(w io.Writer, options []config.Option) {
	fmt.Fprintln(w, "| flag | variable | meaning |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, o := range options {
		env := "—"
		if o.Env() != "" {
			env = "`" + o.Env() + "`"
		}
		fmt.Fprintf(w, "| `--%s %s` | %s | %s |\n", o.Name, cell(o.Arg), env, cell(o.HelpWithDefault()))
	}
	fmt.Fprintf(w, "| `--config PATH` | `%sCONFIG` | a TOML file with the keys above (`url = \"…\"`, `labels = [\"gpu\"]`, `max-idle = \"10m\"`) |\n", config.EnvPrefix)
}
