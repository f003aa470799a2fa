package status

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

func mustReadStatus(t *testing.T, dir string) Status {
	t.Helper()
	st, err := Read(dir)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return st
}

func TestStatusFileWrittenAtOnceThenThrottled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := time.Now()
	s := NewFile(dir, Status{PID: 42, Version: "1.2.3", Engine: "wss://e/x", State: "connecting"}, logging.NewRedactor(""), func(err error) { t.Errorf("write failed: %v", err) })
	defer s.Flush()

	st := mustReadStatus(t, dir)
	if st.PID != 42 || st.Version != "1.2.3" || st.Engine != "wss://e/x" || st.State != "connecting" {
		t.Errorf("first status = %+v", st)
	}
	if st.Updated.IsZero() || st.Updated.Location() != time.UTC {
		t.Errorf("updated = %v, want a UTC time", st.Updated)
	}

	since := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s.Update(func(st *Status) { st.State, st.Name, st.Since, st.CallsRunning = "attached", "box", since, 1 })
	st = mustReadStatus(t, dir)
	if time.Since(start) < 900*time.Millisecond {
		if st.State != "connecting" {
			t.Errorf("an update within a second of the last write was written at once (state %q)", st.State)
		}
	} else if !throttleHolds(t) {
		t.Error("the machine was too slow to check the throttle, five times over")
	}
	s.Flush()
	st = mustReadStatus(t, dir)
	if st.State != "attached" || st.Name != "box" || !st.Since.Equal(since) || st.CallsRunning != 1 {
		t.Errorf("after Flush: %+v", st)
	}

	// The throttled write still happens, without a Flush.
	s.Update(func(st *Status) { st.CallsDone = 7; st.CallsRunning = 0 })
	deadline := time.Now().Add(3 * time.Second)
	for mustReadStatus(t, dir).CallsDone != 7 {
		if time.Now().After(deadline) {
			t.Fatal("a throttled update was never written")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// throttleHolds retries the throttle check on fresh files for a machine
// too loaded to read a file back within a second; it reports whether it
// could check at all.
func throttleHolds(t *testing.T) bool {
	t.Helper()
	for range 5 {
		dir := t.TempDir()
		start := time.Now()
		s := NewFile(dir, Status{State: "connecting"}, logging.NewRedactor(""), nil)
		s.Update(func(st *Status) { st.State = "attached" })
		st := mustReadStatus(t, dir)
		s.Flush()
		if time.Since(start) < 900*time.Millisecond {
			if st.State != "connecting" {
				t.Errorf("an update within a second of the last write was written at once (state %q)", st.State)
			}
			return true
		}
	}
	return false
}

// A worker doing many calls a second rewrites its status at most once a
// second, and the last state reaches the file.
func TestStatusFileAtMostOncePerSecond(t *testing.T) {
	if testing.Short() {
		t.Skip("takes two seconds")
	}
	t.Parallel()
	dir := t.TempDir()
	s := NewFile(dir, Status{State: "attached"}, logging.NewRedactor(""), nil)
	defer s.Flush()

	var mu sync.Mutex
	var writes []time.Time
	seen := map[time.Time]bool{}
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if st, err := Read(dir); err == nil && !seen[st.Updated] {
				seen[st.Updated] = true
				mu.Lock()
				writes = append(writes, st.Updated)
				mu.Unlock()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	end := time.Now().Add(2200 * time.Millisecond)
	n := int64(0)
	for time.Now().Before(end) {
		n++
		done := n
		s.Update(func(st *Status) { st.CallsDone = done })
		time.Sleep(time.Millisecond)
	}
	last := n
	deadline := time.Now().Add(3 * time.Second)
	for mustReadStatus(t, dir).CallsDone != last {
		if time.Now().After(deadline) {
			t.Fatalf("the last update (calls_done %d) never reached the file", last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	<-polled

	mu.Lock()
	defer mu.Unlock()
	if len(writes) > 5 {
		t.Errorf("%d writes seen for %d updates in 2.2s, want at most one a second", len(writes), n)
	}
	for i := 1; i < len(writes); i++ {
		if gap := writes[i].Sub(writes[i-1]); gap < 900*time.Millisecond {
			t.Errorf("writes %d and %d only %v apart", i-1, i, gap)
		}
	}
}

func TestStatusFileIsReplacedWhole(t *testing.T) {
	dir := t.TempDir()
	s := NewFile(dir, Status{State: "connecting", LastError: strings.Repeat("x", 10000)}, logging.NewRedactor(""), nil)
	s.Update(func(st *Status) { st.LastError = "" })
	s.Flush()
	b, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "xxx") || !strings.HasSuffix(string(b), "}\n") {
		t.Errorf("status file holds leftovers of a longer version:\n%s", b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("state dir holds %q, want only status.json", names)
	}
}

func TestStatusFileReportsWriteErrors(t *testing.T) {
	var mu sync.Mutex
	var errs []error
	gone := filepath.Join(t.TempDir(), "missing")
	s := NewFile(gone, Status{}, logging.NewRedactor(""), func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })
	s.Flush()
	mu.Lock()
	defer mu.Unlock()
	if len(errs) == 0 {
		t.Error("writing into a missing directory reported no error")
	}
}

func TestReadStatusErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir); !os.IsNotExist(err) {
		t.Errorf("Read with no file = %v, want not-exist", err)
	}
	os.WriteFile(Path(dir), []byte("{half"), 0o644)
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), Path(dir)) {
		t.Errorf("Read of a broken file = %v, want an error naming it", err)
	}
}

// After Close nothing is written: a worker on its way out has let its
// state directory go (a test's cleanup, or the next worker, removes it).
func TestStatusFileWritesNothingAfterClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var failed []error
	var mu sync.Mutex
	s := NewFile(dir, Status{PID: 42, State: "connecting"}, logging.NewRedactor(""), func(err error) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, err)
	})
	s.Update(func(st *Status) { st.State = "stopped" })
	s.Close()
	if st := mustReadStatus(t, dir); st.State != "stopped" {
		t.Errorf("Close wrote state %q; want the last one, stopped", st.State)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s.Update(func(st *Status) { st.State = "attached" })
	s.Flush()
	if _, err := os.Stat(dir); err == nil {
		t.Error("the status was written into the state directory after Close")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Errorf("writes were tried after Close: %v", failed)
	}
}

// `status` right after a burst of calls shows their end, not the counts
// of the write before the burst: a change still pending (the file is
// rewritten at most once a second) is waited for.
func TestReadSettledShowsThePendingChange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := NewFile(dir, Status{PID: 42, State: "attached"}, logging.NewRedactor(""), func(err error) { t.Errorf("write failed: %v", err) })
	defer s.Close()
	s.Update(func(st *Status) { st.CallsRunning = 1 }) // within the second: pending
	for range 3 {
		s.Update(func(st *Status) { st.CallsDone++ })
	}
	s.Update(func(st *Status) { st.CallsRunning = 0 })
	if st := mustReadStatus(t, dir); st.CallsDone != 0 {
		t.Fatalf("the first write already had %d calls done; this test needs the change pending", st.CallsDone)
	}
	st, err := ReadSettled(dir)
	if err != nil || st.CallsRunning != 0 || st.CallsDone != 3 {
		t.Errorf("ReadSettled right after three calls ended: %d running, %d done (%v); want 0 running, 3 done", st.CallsRunning, st.CallsDone, err)
	}
}
