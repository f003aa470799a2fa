package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/platform"
)

// smallDisk mounts a tmpfs of size bytes for the test, private to this
// user, or skips where this process may not mount (not root).
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a small file system here (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestFullDiskDeclinesCalls: with less than --min-free-disk free in the
// state directory, a new call is declined as a drain's is (NodeCancelled,
// so the engine runs it elsewhere), /healthz says why, and the metrics
// count it; once space is freed, calls run again.
func TestFullDiskDeclinesCalls(t *testing.T) {
	t.Parallel()
	state := smallDisk(t, "32m")
	f := serveFake(t, enginetest.Options{}, "--state-dir", state, "--min-free-disk", "16MiB", "--listen", "127.0.0.1:0")
	base := monitoring(t, f)
	call := func(id string) enginetest.Message {
		t.Helper()
		return answerOf(t, f.runReq(t, map[string]any{"call_id": id, "node": map[string]any{"module": "m"}}))
	}
	if m := call("roomy"); !m.OK {
		t.Fatalf("a call with room on the disk answered %s", m.Raw)
	}
	filler := filepath.Join(state, "filler")
	if err := os.WriteFile(filler, make([]byte, 20<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	declined(t, call("full"), protocol.TypeNodeCancelled, "declined by this worker: too little free disk: ")
	code, body := httpGet(t, base+"/healthz")
	if code != 503 || !strings.Contains(body, "--min-free-disk 16MiB") || !strings.Contains(body, state) {
		t.Errorf("/healthz with the disk full: %d %q; want 503 saying where and --min-free-disk", code, body)
	}
	_, m := httpGet(t, base+"/metrics")
	if want := `fluksio_worker_calls_declined_total{reason="disk"} 1`; !strings.Contains(m, want) {
		t.Errorf("/metrics does not say %s", want)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// A process another test forks in this one may hold the file open
	// until it executes: its space comes back then.
	for deadline := time.Now().Add(callTimeout); ; time.Sleep(10 * time.Millisecond) {
		if free, err := platform.FreeBytes(state); err == nil && free >= 16<<20 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d bytes free in %s after its filler was removed", free, state)
		}
	}
	if m := call("freed"); !m.OK {
		t.Errorf("a call after the disk was freed answered %s", m.Raw)
	}
	if code, body := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz after the disk was freed: %d %q", code, body)
	}
}
