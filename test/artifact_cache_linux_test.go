package test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// The artifact cache end to end: real loads (load_artifact, the embedded
// runtime on a real Python) into a state directory on a small file system
// of its own, which the cache alone would fill.

const cacheNodes = `
import hashlib
from fluksio import load_artifact

def load(digest):
    with open(load_artifact(digest), "rb") as f:
        return {"sha": hashlib.sha256(f.read()).hexdigest()}

def hold(digest, fifo):
    path = load_artifact(digest)
    with open(fifo) as f:  # the test's go-ahead: it opened the other end once this call had loaded
        f.read()
    with open(path, "rb") as f:  # opened again, as a node that loads its weights lazily does
        return {"sha": hashlib.sha256(f.read()).hexdigest()}
`

// TestArtifactCacheNeverTakesTheWorkerOutOfService: on 128 MiB with
// --min-free-disk 40MiB, three loads of 30 MiB would leave less free than
// that, and every later call declined for as long as the cache stays. The
// worker removes what it cached, least recently used first, so the next
// call runs; the artifact a call still running loaded stays, and that call
// reads it again intact.
func TestArtifactCacheNeverTakesTheWorkerOutOfService(t *testing.T) {
	t.Parallel()
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", disk, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=128m,mode=0700"); err != nil {
		t.Skipf("cannot mount a small file system here (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(disk, unix.MNT_DETACH) })

	eng := startEngine(t, enginetest.Options{})
	var digests []string
	for i := range 3 {
		digests = append(digests, eng.PutArtifact(bytes.Repeat([]byte{byte('a' + i)}, 30<<20)))
	}
	fifo := filepath.Join(t.TempDir(), "go-ahead")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	startBinary(t, []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
		"run", "--url", eng.AttachURL(), "--python", runtimePython(t), "--runtime", "embedded",
		"--state-dir", filepath.Join(disk, "state"), "--parallel", "2",
		"--min-free-disk", "40MiB", "--artifact-cache-max", "100%",
		// The cache in the state directory is the calls' where they run
		// without a sandbox (in one, each call caches for itself, in its
		// call directory); the fifo is in the test's /tmp.
		"--sandbox", "off")
	wk := attach(t, eng)
	sha := func(answer map[string]any) string { s, _ := outputsOf(t, answer)["sha"].(string); return "sha256:" + s }

	held := startNode(t, wk, nodeRun("hold-first", cacheNodes, "hold", map[string]any{"digest": digests[0], "fifo": fifo}))
	goAhead, err := os.OpenFile(fifo, os.O_WRONLY, 0) // returns once the call loaded its artifact
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range digests[1:] {
		answer, _ := runNode(t, wk, nodeRun("load-"+string(rune('b'+i)), cacheNodes, "load", map[string]any{"digest": d}))
		if got := sha(answer); got != d {
			t.Fatalf("loaded %s, want %s", got, d)
		}
	}
	// 90 MiB cached: the disk is short, and only the cache is to blame.
	answer, _ := runNode(t, wk, nodeRun("after-three", cacheNodes, "load", map[string]any{"digest": digests[2]}))
	if got := sha(answer); got != digests[2] {
		t.Fatalf("the call after three loads: %v; want it run, with %s", answer, digests[2])
	}
	goAhead.Close()
	last, _ := wait(t, held)
	var out map[string]any
	if err := last.Decode(&out); err != nil {
		t.Fatal(err)
	}
	if got := sha(out); got != digests[0] {
		t.Errorf("the call that held its artifact read it again as %s, want %s: removed from under it?", got, digests[0])
	}
	cached := filepath.Join(disk, "state", "artifacts", "sha256")
	if _, err := os.Stat(filepath.Join(cached, strings.TrimPrefix(digests[1], "sha256:"))); err == nil {
		t.Errorf("the artifact used least recently (and by no running call) is still cached")
	}
}
