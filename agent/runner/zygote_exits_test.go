//go:build linux

package runner

import (
	"encoding/binary"
	"os"
	"syscall"
	"testing"
	"time"
)

// exitRecord is a zygote's report of a runner's end, as ExitReports
// writes it.
func exitRecord(pid int, ws syscall.WaitStatus, maxRSSKiB uint64) []byte {
	rec := make([]byte, exitRecordSize)
	binary.NativeEndian.PutUint32(rec, uint32(pid))
	binary.NativeEndian.PutUint32(rec[4:], uint32(ws))
	binary.NativeEndian.PutUint64(rec[8:], maxRSSKiB)
	return rec
}

// A runner may exit, and its zygote report it, before the worker has
// read the fork's answer and registered the pid: its report waits for it.
// Reports reach the waiter of their pid whatever the order, and whatever
// pieces the pipe hands them over in.
func TestRunnerExitReportedBeforeItsRegistration(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	x := newRunnerExits(r)
	defer func() {
		w.Close()
		<-x.done
	}()
	w.Write(exitRecord(101, exitedAt(7), 2048)) // before its registration
	registered := x.expect(202)
	// A record in two writes: the reader waits for the rest of it.
	rec := exitRecord(202, syscall.WaitStatus(syscall.SIGUSR1), 1)
	w.Write(rec[:5])
	select {
	case e := <-registered:
		t.Fatalf("a report came from half a record: %+v", e)
	case <-time.After(10 * time.Millisecond):
	}
	w.Write(rec[5:])
	if e := waitReport(t, registered); !e.status.Signaled() || e.status.Signal() != syscall.SIGUSR1 || e.peakRSS != 1024 {
		t.Errorf("runner 202 registered first: reported %+v; want killed by SIGUSR1, 1 KiB at its peak", e)
	}
	// Registered after its report was read.
	deadline := time.Now().Add(waitLong)
	for {
		x.mu.Lock()
		_, read := x.early[101]
		x.mu.Unlock()
		if read || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if e := waitReport(t, x.expect(101)); e.status != exitedAt(7) || e.peakRSS != 2048<<10 {
		t.Errorf("runner 101 reported before its registration: %+v; want exit status 7, 2 MiB at its peak", e)
	}
	x.mu.Lock()
	left := len(x.early) + len(x.waiting)
	x.mu.Unlock()
	if left != 0 {
		t.Errorf("%d reports or waiters kept after each was handed on", left)
	}
}

func exitedAt(code int) syscall.WaitStatus { return syscall.WaitStatus(code << 8) }

func waitReport(t *testing.T, ch <-chan *runnerExit) *runnerExit {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(waitLong):
		t.Fatalf("no report within %s", waitLong)
		return nil
	}
}
