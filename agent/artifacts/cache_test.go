//go:build unix

package artifacts_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/artifacts"
)

const mib = 1 << 20

// entry writes a cache entry as the runtime leaves one (worker_main.py:
// _cache_file, _write_stamp, unpacked_directory, _digest_lock,
// _hold_in_use): a read-only file of size bytes and its stamp, its lock
// file, and its use file last touched at used. With tree, the file is
// also unpacked beside it, read-only throughout. It returns the digest.
func entry(t *testing.T, root, name string, size int, used time.Time, tree bool) string {
	t.Helper()
	sum := sha256.Sum256([]byte(name))
	digest := hex.EncodeToString(sum[:])
	dir := filepath.Join(root, "sha256")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, digest)
	write := func(path string, n int, mode os.FileMode) {
		if err := os.WriteFile(path, make([]byte, n), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(base, size, 0o444)
	write(base+".ok", 20, 0o600)
	write(filepath.Join(dir, "."+digest+".lock"), 0, 0o600)
	if tree {
		sub := filepath.Join(base+".d", "model", "weights")
		if err := os.MkdirAll(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(sub, "part-0"), size, 0o444)
		write(filepath.Join(base+".d", "config.json"), 10, 0o444)
		for _, d := range []string{sub, filepath.Dir(sub), base + ".d"} {
			os.Chmod(d, 0o555)
		}
		write(base+".d.ok", 20, 0o600)
	}
	use := filepath.Join(dir, "."+digest+".use")
	write(use, 0, 0o600)
	for _, p := range []string{base, base + ".d", use} {
		if err := os.Chtimes(p, used, used); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	return digest
}

// names lists what is left in the cache's directory.
func names(t *testing.T, root string) map[string]bool {
	t.Helper()
	list, err := os.ReadDir(filepath.Join(root, "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, e := range list {
		left[e.Name()] = true
	}
	return left
}

// hold takes a lock on one of an entry's lock files as a running call
// does (suffix .use, shared: it loaded the entry; .lock, exclusive: it is
// loading it), on an open file of its own, until the test ends.
func hold(t *testing.T, root, digest, suffix string, how int) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(root, "sha256", "."+digest+suffix), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
}

// TestTrimRemovesTheLeastRecentlyUsedFirst: past the bound, entries go
// by their last use (the use file's time, which a load touches), the
// oldest first, each whole (file, stamps, unpacked tree, lock files), and
// the cache ends at most at the bound; what is not an entry (a part the
// runtime is writing) is not touched.
func TestTrimRemovesTheLeastRecentlyUsedFirst(t *testing.T) {
	root := t.TempDir()
	now := time.Now()
	// Fetched in this order, but the first was loaded again last.
	a := entry(t, root, "a", 3*mib, now, true)
	b := entry(t, root, "b", 3*mib, now.Add(-3*time.Hour), false)
	c := entry(t, root, "c", 3*mib, now.Add(-2*time.Hour), true)
	d := entry(t, root, "d", 3*mib, now.Add(-time.Hour), false)
	part := filepath.Join(root, "sha256", ".part-x1y2")
	if err := os.WriteFile(part, make([]byte, mib), 0o600); err != nil {
		t.Fatal(err)
	}
	cache := artifacts.New(root)
	list, err := cache.Entries()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range list {
		order = append(order, e.Digest)
	}
	if want := []string{b, c, d, a}; !slices.Equal(order, want) {
		t.Fatalf("entries by last use: %.8s; want %.8s", order, want)
	}
	// a and c hold their file and a tree of as much: 6 MiB and some each.
	r, err := cache.Trim(10*mib, nil)
	if err != nil {
		t.Fatal(err)
	}
	left := names(t, root)
	for _, gone := range []string{b, "." + b + ".lock", "." + b + ".use", b + ".ok", c, c + ".d", c + ".d.ok", "." + c + ".use"} {
		if left[gone] {
			t.Errorf("%.12s is left after the trim; the two used least recently should be gone whole", gone)
		}
	}
	for _, kept := range []string{a, a + ".d", d, ".part-x1y2"} {
		if !left[kept] {
			t.Errorf("%.12s was removed; only the two used least recently should be", kept)
		}
	}
	if r.Removed != 2 || r.Left > 10*mib || r.Left < 9*mib {
		t.Errorf("trim: %+v; want 2 removed and 9-10 MiB left", r)
	}
	// Within its bound, the cache is left alone.
	if r, err := cache.Trim(10*mib, nil); err != nil || r.Removed != 0 {
		t.Errorf("a second trim: %+v, %v; want nothing removed", r, err)
	}
}

// TestTrimKeepsWhatCallsUse: an entry a call loaded (its use file locked
// shared) or is loading (its lock held) stays, however old and whatever
// the bound; the others go, and short is asked after each.
func TestTrimKeepsWhatCallsUse(t *testing.T) {
	root := t.TempDir()
	old := time.Now().Add(-24 * time.Hour)
	loaded := entry(t, root, "loaded", mib, old, true)
	loading := entry(t, root, "loading", mib, old.Add(time.Minute), false)
	idle1 := entry(t, root, "idle1", mib, old.Add(2*time.Minute), false)
	idle2 := entry(t, root, "idle2", mib, old.Add(3*time.Minute), false)
	hold(t, root, loaded, ".use", unix.LOCK_SH)
	hold(t, root, loading, ".lock", unix.LOCK_EX)
	asked := 0
	r, err := artifacts.New(root).Trim(1<<40, func() bool { asked++; return asked <= 3 })
	if err != nil {
		t.Fatal(err)
	}
	left := names(t, root)
	if !left[loaded] || !left[loaded+".d"] || !left[loading] {
		t.Errorf("an entry in use was removed: %v", left)
	}
	if left[idle1] || !left[idle2] {
		t.Errorf("with the disk short for three checks, the idle entry used least recently should go, the other stay: %v", left)
	}
	if r.Removed != 1 || r.InUse != 2 {
		t.Errorf("trim: %+v; want 1 removed, 2 in use", r)
	}
}
