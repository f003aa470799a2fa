package metrics

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Every metric field of Metrics is declared in the table (so it is made,
// registered and documented), and each row is in the README's table with
// its labels.
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
	var doc strings.Builder
	if err := m.WriteTable(&doc); err != nil {
		t.Fatal(err)
	}
	for _, d := range m.table() {
		name := Namespace + "_" + d.name
		if len(d.labels) > 0 {
			labels := slices.Sorted(slices.Values(d.labels)) // as the registry sorts them
			name += "{" + strings.Join(labels, ",") + "}"
		}
		if !strings.Contains(doc.String(), "| `"+name+"` |") {
			t.Errorf("the README's table lacks %s", name)
		}
	}
}
