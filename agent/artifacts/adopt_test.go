//go:build linux

package artifacts_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/artifacts"
)

// ownCache is a sandboxed call's own artifact cache, as the runtime
// leaves it: each of files written under its digest's name (or the name
// given, for a file planted under another digest).
type ownFile struct {
	name string // "" for the digest of data
	data string
}

func ownCache(t *testing.T, files ...ownFile) (own string, digests []string) {
	t.Helper()
	own = filepath.Join(t.TempDir(), ".fluksio-artifacts")
	dir := filepath.Join(own, "sha256")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.data))
		name := f.name
		if name == "" {
			name = hex.EncodeToString(sum[:])
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(f.data), 0o444); err != nil {
			t.Fatal(err)
		}
		digests = append(digests, name)
	}
	return own, digests
}

// TestAdoptTakesInWhatHasItsDigest: what a sandboxed call fetched is taken
// into the worker's cache, read-only and stamped as the runtime stamps a
// file it verified (Python computes the stamp here), so that the next
// call loads it from there; bytes under another digest's name are not.
func TestAdoptTakesInWhatHasItsDigest(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	root := t.TempDir()
	c := artifacts.New(root)
	other := sha256.Sum256([]byte("the real weights"))
	own, digests := ownCache(t, ownFile{data: "model weights"}, ownFile{name: hex.EncodeToString(other[:]), data: "planted weights"})
	if n := c.Adopt(own); n != 1 {
		t.Fatalf("Adopt took %d files, want 1", n)
	}
	good := filepath.Join(root, "sha256", digests[0])
	if b, err := os.ReadFile(good); err != nil || string(b) != "model weights" {
		t.Fatalf("the adopted entry holds %q, %v", b, err)
	}
	if st, _ := os.Stat(good); st.Mode().Perm() != 0o444 {
		t.Errorf("the adopted entry has mode %o, want 0444", st.Mode().Perm())
	}
	stamp, err := os.ReadFile(good + ".ok")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "-c", `import os, sys
st = os.lstat(sys.argv[1])
sys.stdout.write("%d %d %d %d %o" % (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode))`, good).Output()
	if err != nil || string(out) != string(stamp) {
		t.Errorf("the stamp %q is not the runtime's %q (%v)", stamp, out, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "sha256", digests[1])); err == nil {
		t.Errorf("bytes planted under another digest were taken in")
	}
	if _, err := os.Lstat(filepath.Join(root, "sha256", "."+digests[0]+".use")); err != nil {
		t.Errorf("the adopted entry has no use file: %v", err)
	}
	// Sandboxed calls load it by name from the shown directory, which
	// they cannot list; the stamp still holds for the file there.
	shown := artifacts.ShownDir(root)
	if st, err := os.Stat(shown); err != nil || st.Mode().Perm() != 0o311 {
		t.Errorf("the shown directory: %v, %v", st, err)
	}
	for _, name := range []string{digests[0], digests[0] + ".ok", "." + digests[0] + ".use"} {
		a, _ := os.Stat(filepath.Join(root, "sha256", name))
		b, err := os.Stat(filepath.Join(shown, name))
		if err != nil || !os.SameFile(a, b) {
			t.Errorf("%s is not shown as the cache's own (%v)", name, err)
		}
	}
	// Trimmed away, it is gone from there too.
	if r, err := c.Trim(0, nil); err != nil || r.Removed != 1 {
		t.Fatalf("trim: %+v %v", r, err)
	}
	if left, _ := os.ReadDir(shown); len(left) != 0 {
		t.Errorf("the shown directory still holds %v", left)
	}
}

// TestAdoptLeavesWhatIsNotAFileOfTheCalls: a link (to a file the worker
// may read and the call may not), a file with another name elsewhere (a
// hard link), and a digest the cache holds already are left where they are.
func TestAdoptLeavesWhatIsNotAFileOfTheCalls(t *testing.T) {
	root := t.TempDir()
	c := artifacts.New(root)
	secret := filepath.Join(t.TempDir(), "token")
	os.WriteFile(secret, []byte("the worker's secret"), 0o600)
	sum := sha256.Sum256([]byte("the worker's secret"))
	linked := hex.EncodeToString(sum[:])
	own, digests := ownCache(t, ownFile{data: "kept twice"}, ownFile{data: "already cached"})
	dir := filepath.Join(own, "sha256")
	if err := os.Symlink(secret, filepath.Join(dir, linked)); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, digests[0]), filepath.Join(dir, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	// digests[1] is in the cache already, verified: it stays the cache's.
	first, _ := ownCache(t, ownFile{data: "already cached"})
	if n := c.Adopt(first); n != 1 {
		t.Fatalf("the first adoption took %d", n)
	}
	before, _ := os.Stat(filepath.Join(root, "sha256", digests[1]))
	// Shown no longer (as an entry a worker without a sandbox cached):
	// shown again, from the cache's own file.
	os.Remove(filepath.Join(artifacts.ShownDir(root), digests[1]+".ok"))
	if n := c.Adopt(own); n != 0 {
		t.Errorf("Adopt took %d files, want none", n)
	}
	for _, d := range []string{linked, digests[0]} {
		if _, err := os.Lstat(filepath.Join(root, "sha256", d)); err == nil {
			t.Errorf("%s was taken in", d)
		}
	}
	after, _ := os.Stat(filepath.Join(root, "sha256", digests[1]))
	if !os.SameFile(before, after) {
		t.Errorf("an entry the cache held was replaced")
	}
	if shown, err := os.Stat(filepath.Join(artifacts.ShownDir(root), digests[1])); err != nil || !os.SameFile(before, shown) {
		t.Errorf("the entry the cache held is not shown again (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(artifacts.ShownDir(root), digests[1]+".ok")); err != nil {
		t.Errorf("its stamp is not shown again (%v)", err)
	}
}

// TestAdoptMarksWhatTheCallUsed: an entry of the worker's cache that a
// sandboxed call loaded (its own use file says so) is marked used, and so
// kept over those not used since.
func TestAdoptMarksWhatTheCallUsed(t *testing.T) {
	root := t.TempDir()
	c := artifacts.New(root)
	old := time.Now().Add(-48 * time.Hour)
	used := entry(t, root, "used by the call", 4*mib, old, false)
	idle := entry(t, root, "not used", 4*mib, old.Add(time.Hour), false)
	own := filepath.Join(t.TempDir(), ".fluksio-artifacts")
	os.MkdirAll(filepath.Join(own, "sha256"), 0o700)
	os.WriteFile(filepath.Join(own, "sha256", "."+used+".use"), nil, 0o600)
	c.Adopt(own)
	r, err := c.Trim(5*mib, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Removed != 1 {
		t.Fatalf("trim: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(root, "sha256", used)); err != nil {
		t.Errorf("the entry the call used was removed")
	}
	if _, err := os.Stat(filepath.Join(root, "sha256", idle)); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("the entry not used since stayed: %v", err)
	}
}
