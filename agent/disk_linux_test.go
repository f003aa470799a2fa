package agent_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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

// cachedArtifact leaves in a state directory's artifact cache what a load
// of size bytes leaves there (worker_main.py's load_artifact: the
// read-only file named by its digest, its stamp, its use file touched at
// used), as a worker that ran such calls before this one left it.
func cachedArtifact(t *testing.T, stateDir, name string, size int, used time.Time) string {
	t.Helper()
	sum := sha256.Sum256([]byte(name))
	digest := hex.EncodeToString(sum[:])
	dir := filepath.Join(stateDir, "artifacts", "sha256")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for path, n := range map[string]int{filepath.Join(dir, digest): size, filepath.Join(dir, digest+".ok"): 40, filepath.Join(dir, "."+digest+".use"): 0} {
		if err := os.WriteFile(path, make([]byte, n), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, used, used); err != nil {
			t.Fatal(err)
		}
	}
	return digest
}

// TestFullCacheDoesNotDeclineCalls: a worker restarted on a disk its own
// artifact cache filled (three loads of 30 MiB on 128 MiB, --min-free-disk
// 40MiB) takes calls: the artifacts used least recently are removed until
// the disk has room, before any call would be declined, and /healthz is
// healthy; those used last stay.
func TestFullCacheDoesNotDeclineCalls(t *testing.T) {
	t.Parallel()
	disk := smallDisk(t, "128m")
	state := filepath.Join(disk, "state")
	now := time.Now()
	oldest := cachedArtifact(t, state, "first", 30<<20, now.Add(-3*time.Hour))
	newest := cachedArtifact(t, state, "second", 30<<20, now.Add(-time.Hour))
	middle := cachedArtifact(t, state, "third", 30<<20, now.Add(-2*time.Hour))
	if free, err := platform.FreeBytes(disk); err != nil || free >= 40<<20 {
		t.Fatalf("%d bytes free (%v); the test needs less than 40MiB", free, err)
	}
	// The bound is the whole disk: only --min-free-disk makes room here.
	f := serveFake(t, enginetest.Options{}, "--state-dir", state, "--min-free-disk", "40MiB", "--artifact-cache-max", "100%", "--listen", "127.0.0.1:0")
	base := monitoring(t, f)
	if m := answerOf(t, f.runReq(t, map[string]any{"call_id": "after-restart", "node": map[string]any{"module": "m"}})); !m.OK {
		t.Fatalf("a call on a disk the cache filled answered %s", m.Raw)
	}
	if code, body := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz with the cache trimmed: %d %q", code, body)
	}
	cached := filepath.Join(state, "artifacts", "sha256")
	for digest, want := range map[string]bool{oldest: false, middle: true, newest: true} {
		if _, err := os.Stat(filepath.Join(cached, digest)); (err == nil) != want {
			t.Errorf("artifact %.8s kept: %v; want %v (the one used least recently goes, alone)", digest, err == nil, want)
		}
	}
	if free, err := platform.FreeBytes(disk); err != nil || free < 40<<20 {
		t.Errorf("%d bytes free (%v) after the trim; want at least --min-free-disk", free, err)
	}
}

// TestArtifactCacheMaxBoundsTheCache: a worker started with more cached
// than --artifact-cache-max removes the artifacts used least recently
// until the cache is within it, and takes calls meanwhile.
func TestArtifactCacheMaxBoundsTheCache(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state")
	now := time.Now()
	var digests []string
	for i := range 5 {
		digests = append(digests, cachedArtifact(t, state, fmt.Sprint("artifact-", i), 1<<20, now.Add(time.Duration(i-5)*time.Hour)))
	}
	f := serveFake(t, enginetest.Options{}, "--state-dir", state, "--artifact-cache-max", "2500KiB")
	if m := answerOf(t, f.runReq(t, map[string]any{"call_id": "c", "node": map[string]any{"module": "m"}})); !m.OK {
		t.Fatalf("the call answered %s", m.Raw)
	}
	// Trimmed at the start and after each call: the log says so once done.
	eventually(t, callTimeout, "the cache's trim", func() bool {
		return strings.Contains(f.log.String(), "removed the artifacts used least recently from the cache")
	})
	cached := filepath.Join(state, "artifacts", "sha256")
	for i, digest := range digests {
		_, err := os.Stat(filepath.Join(cached, digest))
		if want := i >= 3; (err == nil) != want {
			t.Errorf("artifact %d (the oldest is 0) kept: %v; want %v: the two used last fit in 2500KiB", i, err == nil, want)
		}
	}
}
