//go:build linux

package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/platform"
)

// warmRig is a pool keeping spares, with metrics to read what it did.
func warmRig(t *testing.T, spares int, preload ...string) (*rig, *metrics.Metrics) {
	m := metrics.New("test", 1)
	r := newRig(t, func(c *Config) {
		c.Spares, c.Metrics, c.Preload = spares, m, preload
	})
	// A spare started within changeSlack of its runtime file's last change
	// counts as stale (the file system's clock is coarse): let the file
	// the rig just wrote be older than that first.
	var st unix.Stat_t
	if err := unix.Stat(r.runtime, &st); err != nil {
		t.Fatal(err)
	}
	changed := time.Unix(st.Ctim.Unix())
	for time.Since(changed) <= 2*changeSlack {
		time.Sleep(changeSlack)
	}
	return r, m
}

// metric reads one series of the worker's registry (labels aside).
func metric(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		sum := 0.0
		for _, s := range f.GetMetric() {
			sum += s.GetGauge().GetValue() + s.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// readySpares lists the pids of the spares ready for a call.
func (r *rig) readySpares() []int {
	p := r.pool.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for _, we := range p.envs {
		for _, s := range we.spares {
			if s.state == spareReady {
				pids = append(pids, s.box.pid)
			}
		}
	}
	return pids
}

// waitSpare waits for a ready spare other than those in not.
func (r *rig) waitSpare(t *testing.T, m *metrics.Metrics, not ...int) int {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for time.Now().Before(deadline) {
		for _, pid := range r.readySpares() {
			if !slices.Contains(not, pid) && metric(t, m, "fluksio_worker_warm_runners") >= 1 {
				return pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no new spare runner within %s", waitLong)
	return 0
}

// runPID runs a call to its end and returns the pid that answered it.
func (r *rig) runPID(t *testing.T, id string, env []string) int {
	t.Helper()
	c := r.mustStart(context.Background(), id, env)
	a := answer(t, c.output(t))
	c.end(t, true)
	return pidOf(a["outputs"].(map[string]any), "pid")
}

// The first call of an environment starts cold and teaches the pool; the
// next call of it is handed the spare started meanwhile; a call of another
// environment starts cold.
func TestWarmSpareServesTheNextCallOfItsEnvironment(t *testing.T) {
	t.Parallel()
	r, m := warmRig(t, 1, "json", "missing_module")
	env := []string{"OMP_NUM_THREADS=2"}
	cold := r.runPID(t, "teach", env)
	spare := r.waitSpare(t, m)
	if spare == cold {
		t.Fatalf("the spare %d is the process that ran the first call", spare)
	}
	if got := r.runPID(t, "warm", env); got != spare {
		t.Errorf("the second call ran in %d; want the spare %d", got, spare)
	}
	if hits, misses := metric(t, m, "fluksio_worker_warm_runner_hits_total"), metric(t, m, "fluksio_worker_warm_runner_misses_total"); hits != 1 || misses != 1 {
		t.Errorf("%v hits, %v misses; want 1 and 1", hits, misses)
	}
	r.runPID(t, "other", []string{"OMP_NUM_THREADS=8"})
	if misses := metric(t, m, "fluksio_worker_warm_runner_misses_total"); misses != 2 {
		t.Errorf("%v misses after a call of a new environment; want 2", misses)
	}
	if log := r.log.String(); !strings.Contains(log, "missing_module") || strings.Contains(log, `module=json`) {
		t.Errorf("the log should name the --preload module that failed, and only it:\n%s", log)
	}
}

// A spare whose code changed on disk since it started is not handed a
// call: it would run older code than a cold start. The change is seen by
// inotify, and by a status check where the worker has no inotify.
func TestStaleSpareIsNotUsed(t *testing.T) {
	t.Parallel()
	changes := map[string]func(path string) error{
		// Any change of the file's inode (its ctime) counts.
		"mode": func(path string) error { return os.Chmod(path, 0o640) },
		"edited in place": func(path string) error {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				_, err = f.WriteString("# edited\n")
				f.Close()
			}
			return err
		},
	}
	for _, inotify := range []bool{true, false} {
		for name, change := range changes {
			t.Run(fmt.Sprintf("%s/inotify=%v", name, inotify), func(t *testing.T) {
				t.Parallel()
				r, m := warmRig(t, 1)
				w := newChangeWatcher(false)
				if inotify {
					w = testWatcher(t)
				}
				r.pool.warm.mu.Lock()
				r.pool.warm.changes = w
				r.pool.warm.mu.Unlock()
				r.runPID(t, "teach", nil)
				spare := r.waitSpare(t, m)
				if err := change(r.runtime); err != nil {
					t.Fatal(err)
				}
				if got := r.runPID(t, "after-change", nil); got == spare {
					t.Error("a spare whose runtime changed after it started served a call")
				}
				if hits := metric(t, m, "fluksio_worker_warm_runner_hits_total"); hits != 0 {
					t.Errorf("%v hits; want none", hits)
				}
				r.waitSpare(t, m, spare) // and it is replaced
			})
		}
	}
}

// A spare that dies while it waits is replaced.
func TestSpareKilledWhileWaitingIsReplaced(t *testing.T) {
	t.Parallel()
	r, m := warmRig(t, 1)
	r.runPID(t, "teach", nil)
	spare := r.waitSpare(t, m)
	p, _ := os.FindProcess(spare)
	p.Kill()
	next := r.waitSpare(t, m, spare)
	if got := r.runPID(t, "after-kill", nil); got != next {
		t.Errorf("the call ran in %d; want the replacement spare %d", got, next)
	}
}

// Close stops every spare and removes their call directories.
func TestCloseStopsTheSpares(t *testing.T) {
	t.Parallel()
	r, m := warmRig(t, 2)
	// Two calls at once teach the pool to keep two spares.
	a := r.mustStart(context.Background(), "a", nil, map[string]any{"sleep_ms": 300})
	b := r.mustStart(context.Background(), "b", nil, map[string]any{"sleep_ms": 300})
	for _, c := range []*call{a, b} {
		answer(t, c.output(t))
		c.end(t, true)
	}
	first := r.waitSpare(t, m)
	second := r.waitSpare(t, m, first)
	r.pool.Close()
	for _, pid := range []int{first, second} {
		if platform.ProcessAlive(pid) {
			t.Errorf("spare %d outlived Close", pid)
		}
	}
	if dirs := r.callDirs(); len(dirs) != 0 {
		t.Errorf("Close left call directories: %v", dirs)
	}
	if n := metric(t, m, "fluksio_worker_warm_runners"); n != 0 {
		t.Errorf("%v warm runners after Close", n)
	}
	// A closed pool starts calls cold, and keeps no spare for them.
	r.runPID(t, "after-close", nil)
	if pids := r.readySpares(); len(pids) != 0 {
		t.Errorf("a closed pool started spares %v", pids)
	}
}

// A runner script that does not know spare mode (an engine's own, from
// before spares: it does not answer --fluksio-capabilities) is told apart
// at its first call: its calls start cold and no spare is started for
// them (one would never report, and hold its place for
// spareReadyTimeout), and the log says why, once.
func TestRuntimeWithoutSpareModeGetsNoSpares(t *testing.T) {
	t.Parallel()
	r, m := warmRig(t, 1)
	r.pool.Close()
	r.cfg.BaseEnv = append(r.cfg.BaseEnv, "FAKERUNNER_NO_MODES=1")
	r.open(nil)
	for _, id := range []string{"first", "second"} {
		r.runOn(t, Runtime{Path: r.runtime}, id)
	}
	p := r.pool.warm
	p.mu.Lock()
	started := 0
	for _, we := range p.envs {
		started += len(we.ownLocked())
	}
	p.mu.Unlock()
	if started != 0 {
		t.Errorf("%d spares started for a runtime without spare mode", started)
	}
	if misses := metric(t, m, "fluksio_worker_warm_runner_misses_total"); misses != 2 {
		t.Errorf("%v misses; want 2", misses)
	}
	if n := strings.Count(r.log.String(), "does not know spare mode"); n != 1 {
		t.Errorf("the log says %d times that the runtime does not know spare mode; want once:\n%s", n, r.log.String())
	}
}

// A runner script that says it speaks spare mode when asked gets spares,
// whoever made it: an engine's as the worker's own (the Embedded flag
// does not decide).
func TestRuntimeThatSpeaksSpareModeGetsSpares(t *testing.T) {
	t.Parallel()
	r, m := warmRig(t, 1)
	cold := pidOf(r.runOn(t, Runtime{Path: r.runtime}, "teach")["outputs"].(map[string]any), "pid")
	if spare := r.waitSpare(t, m); spare == cold {
		t.Fatalf("the spare %d is the process that ran the first call", spare)
	}
}

// runOn runs a call with no steps on the runtime rt to its end, and
// returns its answer.
func (r *rig) runOn(t *testing.T, rt Runtime, id string) map[string]any {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"call_id": id})
	c := &call{id: id, events: make(chan []byte, 1024)}
	p, err := r.pool.Start(context.Background(), Spec{
		Runtime: rt,
		Request: append(req, '\n'),
		Log:     r.cfg.Log.With("call_id", id),
		Send:    func(msg []byte) { c.events <- append([]byte(nil), msg...); frame.Put(msg) },
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c.Process = p
	a := answer(t, c.output(t))
	c.end(t, true)
	return a
}
