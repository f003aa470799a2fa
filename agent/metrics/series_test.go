package metrics

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Every metric field of Metrics is declared in the table (so it is made,
// registered and documented), and each row is served on /metrics with its
// labels, so the README's table (written from the registry) has it.
func TestEveryMetricIsDeclaredInTheTable(t *testing.T) {
	m := New("1.2.3", 2)
	var nilFields []string
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f, name := v.Field(i), prefix+v.Type().Field(i).Name
			switch {
			case f.Kind() == reflect.Struct:
				walk(name+".", f)
			case f.IsNil():
				nilFields = append(nilFields, name)
			}
		}
	}
	walk("", reflect.ValueOf(m).Elem())
	if len(nilFields) > 0 {
		t.Errorf("Metrics fields without a row in table(): %v", nilFields)
	}
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]string{} // name -> its labels, as /metrics serves them
	for _, f := range families {
		var labels []string
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		served[f.GetName()] = strings.Join(labels, ",")
	}
	for _, d := range m.table() {
		name := Namespace + "_" + d.name
		labels, ok := served[name]
		if !ok {
			t.Errorf("%s is declared but /metrics does not serve it (not registered, or a Vec with no label values made in New)", name)
			continue
		}
		if want := strings.Join(slices.Sorted(slices.Values(d.labels)), ","); labels != want { // the registry sorts them
			t.Errorf("%s is served with labels {%s}, declared with {%s}", name, labels, want)
		}
	}
}
