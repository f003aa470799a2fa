package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	dto "github.com/prometheus/client_model/go"
)

// The documentation's generated tables (TestREADMETables keeps them in step).
// They are written here, in test code, because only the test and its
// -update use them: the worker itself never prints them.

// cell escapes a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// writeOptionsTable writes the README's table of run's options: each
// option's flag, its variable and what it does, with its default.
func writeOptionsTable(w io.Writer, options []config.Option) {
	fmt.Fprintln(w, "| flag | variable | meaning |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for _, o := range options {
		env := "—"
		if o.Env() != "" {
			env = "`" + o.Env() + "`"
		}
		fmt.Fprintf(w, "| `--%s %s` | %s | %s |\n", o.Name, cell(o.Arg), env, cell(o.HelpWithDefault()))
	}
	fmt.Fprintf(w, "| `--config PATH` | `%sCONFIG` | a TOML file with the keys above (`url = \"…\"`, `labels = [\"gpu\"]`, `max-idle = \"10m\"`) |\n", config.EnvPrefix)
}

// writeMetricsTable writes docs/monitoring.md's table of the worker's own series
// from the registry /metrics serves (filled from the metrics package's
// declarations): each series' name and labels, its type and its help.
func writeMetricsTable(w io.Writer, m *metrics.Metrics) error {
	families, err := m.Registry().Gather()
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "| metric | type | meaning |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), metrics.Namespace+"_") {
			continue // the Go runtime's and the process's
		}
		name := f.GetName()
		if ms := f.GetMetric(); len(ms) > 0 && len(ms[0].GetLabel()) > 0 {
			var labels []string
			for _, l := range ms[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
			name += "{" + strings.Join(labels, ",") + "}"
		}
		kind := strings.ToLower(dto.MetricType_name[int32(f.GetType())])
		fmt.Fprintf(w, "| `%s` | %s | %s |\n", name, kind, cell(f.GetHelp()))
	}
	return nil
}
