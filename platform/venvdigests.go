package platform

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// VenvDigests keeps an interpreter's venv digest between connections.
// `pip freeze` costs a third of a CPU-second with a few dozen packages and
// seconds with a large environment; run before every dial, it made a fleet
// reconnecting after an engine restart spend its time hashing package lists
// for dials that were refused. It is run once, and again only when one of
// the interpreter's import directories (sys.path: site-packages,
// dist-packages, user site, PYTHONPATH) changed its modification time, which
// installing, removing or upgrading a package does. A changed environment is
// hashed in the background: the hello at hand carries the last digest, the
// next one the new digest.
type VenvDigests struct {
	python string

	mu         sync.Mutex
	digest     string
	stamp      string   // the import directories' mtimes when digest was taken
	dirs       []string // the interpreter's import directories; nil until asked
	known      bool     // digest was taken
	refreshing bool
	refreshed  chan struct{} // closed when a background refresh ends; for tests
}

// NewVenvDigests keeps the digest of python.
func NewVenvDigests(python string) *VenvDigests {
	return &VenvDigests{python: python}
}

// Get returns the venv digest: taken now the first time (the first hello
// must carry it), afterwards the last one taken, with a refresh started in
// the background when the environment changed since.
func (v *VenvDigests) Get(ctx context.Context) string {
	v.mu.Lock()
	if !v.known {
		v.mu.Unlock()
		dirs := importDirs(ctx, v.python)
		stamp := dirStamp(dirs)
		digest := VenvDigest(ctx, v.python)
		v.mu.Lock()
		defer v.mu.Unlock()
		if ctx.Err() == nil {
			v.dirs, v.stamp, v.digest, v.known = dirs, stamp, digest, true
		}
		return digest
	}
	defer v.mu.Unlock()
	if !v.refreshing && dirStamp(v.dirs) != v.stamp {
		v.refreshing = true
		v.refreshed = make(chan struct{})
		go v.refresh(v.refreshed)
	}
	return v.digest
}

func (v *VenvDigests) refresh(done chan struct{}) {
	defer close(done)
	stamp := dirStamp(v.dirs) // before freezing: a change during it is seen next time
	digest := VenvDigest(context.Background(), v.python)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.digest, v.stamp, v.refreshing = digest, stamp, false
}

// importDirs asks the interpreter for its import directories (sys.path),
// keeping those that are directories. None where the interpreter does not
// answer: the digest is then taken once.
func importDirs(ctx context.Context, python string) []string {
	ctx, cancel := context.WithTimeout(ctx, pythonCheckTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", "import sys\nfor p in sys.path: print(p)")
	cmd.WaitDelay = pipeWaitDelay
	out, err := cmd.Output()
	if err != nil {
		return nil
	}
	var dirs []string
	for _, p := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(p, "/") {
			continue
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

// dirStamp is the directories' modification times: a package installed,
// removed or upgraded adds or removes entries, which changes its
// directory's time.
func dirStamp(dirs []string) string {
	var b strings.Builder
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil {
			b.WriteString(strconv.FormatInt(st.ModTime().UnixNano(), 10))
		}
		b.WriteByte(' ')
	}
	return b.String()
}
