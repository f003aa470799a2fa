package metrics

import (
	"fmt"
	"io"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// WriteTable writes the README's table of the worker's own series, in
// Markdown, from the registry New filled from table (series.go): each series' name and labels, its
// type and its help. A test keeps the README's copy in step (README.md,
// `go test -run TestREADME . -update`), so a new series is documented
// where people look for it.
func (m *Metrics) WriteTable(w io.Writer) error {
	families, err := m.registry.Gather()
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "| metric | type | meaning |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), Namespace+"_") {
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
		fmt.Fprintf(w, "| `%s` | %s | %s |\n", name, kind, strings.ReplaceAll(f.GetHelp(), "|", `\|`))
	}
	return nil
}
