package agent

import (
	"runtime/debug"
	"testing"
)

func TestTuneGCRespectsTheEnvironment(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	for _, env := range []map[string]string{{"GOGC": "200"}, {"GOGC": "off"}, {"GOMEMLIMIT": "1GiB"}} {
		debug.SetGCPercent(100)
		tuneGC(func(k string) string { return env[k] })
		if got := debug.SetGCPercent(100); got != 100 {
			t.Errorf("with %v, GOGC became %d; the user's setting must stand", env, got)
		}
	}
	tuneGC(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("GOGC = %d, want %d", got, gcPercent)
	}
}
