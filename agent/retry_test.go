package agent_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// An outage as the operator reads it: one line for the lost connection,
// then one counted line per failed attempt with how long the worker has
// been down, and nothing else (the runner fetch of --runtime auto keeps
// quiet when the engine is not there); the status file says since when
// and how many attempts; the next "attached" line says how long the
// worker was away, and every one the inventory it advertised. The engine
// is a real one on loopback, closed, then started again on its address.
func TestAnOutageIsCountedQuietly(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--runtime", "auto", "--cpus", "3", "--ram-mb", "2048", "--parallel", "2")
	eventually(t, goneTimeout, "the attached line", func() bool { return strings.Contains(f.log.String(), "msg=attached") })
	first := f.log.String()
	if !regexp.MustCompile(`msg=attached .*inventory\.cpus=3 inventory\.gpus=\d+ inventory\.ram_mb=2048 inventory\.max_parallel=2`).MatchString(first) || strings.Contains(first, "away=") {
		t.Errorf("the first attached line does not show the inventory advertised, or says the worker was away:\n%s", first)
	}
	addr := f.eng.Addr()
	f.eng.Close()
	attempt := regexp.MustCompile(`level=WARN msg="cannot reach the engine; retrying" attempt=(\d+) down_for=\S+ error=`)
	eventually(t, goneTimeout, "two failed attempts to attach", func() bool {
		return len(attempt.FindAllString(f.log.String(), -1)) >= 2
	})
	eventually(t, goneTimeout, "the status file to count the attempts", func() bool {
		st, err := status.Read(f.stateDir)
		return err == nil && st.State == status.StateConnecting && st.Attempts >= 1 && !st.DownSince.IsZero()
	})
	eng, err := enginetest.Start(enginetest.Options{Addr: addr, Tokens: []string{fakeToken}})
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	t.Cleanup(eng.Close)
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	if _, err := eng.NextWorker(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, goneTimeout, "the second attached line", func() bool {
		return strings.Count(f.log.String(), "msg=attached") == 2
	})

	outage := strings.TrimPrefix(f.log.String(), first)
	var warnings []string
	for _, line := range strings.Split(outage, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			warnings = append(warnings, line)
		}
	}
	if len(warnings) < 3 || !strings.Contains(warnings[0], `msg="connection lost; reconnecting"`) {
		t.Fatalf("the outage's warnings: want the lost connection, then one per failed attempt:\n%s", strings.Join(warnings, "\n"))
	}
	for i, line := range warnings[1:] {
		m := attempt.FindStringSubmatch(line)
		if m == nil || m[1] != strconv.Itoa(i+1) {
			t.Errorf("warning %d of the outage is not attempt %d:\n%s", i+2, i+1, line)
		}
	}
	failed := len(warnings) - 1
	again := regexp.MustCompile(`msg=attached .*inventory\.cpus=3 .* away=\S+ failed_attempts=(\d+)`).FindStringSubmatch(outage)
	if again == nil || again[1] != strconv.Itoa(failed) {
		t.Errorf("the attached line after the outage does not say how long the worker was away and %d failed attempts:\n%s", failed, outage)
	}
	// The status file is written at most once a second: wait for it.
	eventually(t, goneTimeout, "the status file to forget the outage once attached", func() bool {
		st, err := status.Read(f.stateDir)
		return err == nil && st.State == status.StateAttached && st.Attempts == 0 && st.DownSince.IsZero()
	})
}
