//go:build unix

// Package artifacts keeps the artifact cache bounded: the files and trees
// node code loads with load_artifact, which the embedded runtime
// (agent/runtime/worker_main.py) fetches into <cache>/sha256 and hands out
// by path. The runtime writes entries; this package is the one that
// removes whole ones, least recently used first, and never one a call is
// using.
//
// An entry is every name of one digest in <cache>/sha256 (64 hex digits,
// <hex> below):
//
//	<hex>          the verified file (a directory's archive, too), read-only
//	<hex>.ok       its stamp
//	<hex>.d        the archive unpacked, a read-only tree, and <hex>.d.ok
//	.<hex>.lock    the digest's lock: held (flock, exclusive) by whoever
//	               checks, fetches, unpacks or removes the entry
//	.<hex>.use     held shared (flock) by every call that loaded the entry,
//	               from its load_artifact until its processes are gone, and
//	               touched (its mtime) at every load: the entry's last use
//
// The two lock files are the contract with the runtime, named in
// worker_main.py's _digest_lock and _hold_in_use. An entry is removed only
// with both locks held exclusively, without waiting: a call that is
// loading it holds the first, one that loaded it holds the second, and
// either makes the entry stay. The lock files go last, while still held;
// the runtime, once it holds a digest's lock, checks that the file it
// locked is still the one of that name (else it opens it again), so two
// processes never both hold "the" lock of one digest.
//
// What a call relies on is the name load_artifact returned: a node may
// open the file, or files in the tree, any time until it ends (a model
// that loads its weights lazily). So an open descriptor or a mapping is
// not what keeps an entry: the shared lock is, and it lasts as long as a
// process of the call (the runner, or a process it forked) holds it. The
// kernel lets go of it when they are gone, killed included.
package artifacts

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Names of an entry's parts beside <hex> (worker_main.py: STAMP_SUFFIX,
// unpacked_directory's target, _digest_lock, _hold_in_use).
const (
	stampSuffix = ".ok"
	treeSuffix  = ".d"
	lockSuffix  = ".lock"
	useSuffix   = ".use"
)

// Cache is the artifact cache in one directory (FLUKSIO_ARTIFACT_CACHE).
// Its methods may be called from any goroutine; one trim runs at a time.
type Cache struct {
	dir string // <cache>/sha256

	mu    sync.Mutex
	sizes map[string]sized // by digest: what an entry took when last measured
}

// sized is an entry's size, good while its file and tree are the same
// inodes unchanged (entries are read-only; the runtime replaces, never
// edits, one found changed).
type sized struct {
	file, tree fileID
	bytes      int64
}

type fileID struct {
	ino   uint64
	mtime int64
}

// New is the cache whose root is dir (the runners' FLUKSIO_ARTIFACT_CACHE).
func New(dir string) *Cache {
	return &Cache{dir: filepath.Join(dir, "sha256"), sizes: map[string]sized{}}
}

// Entry is one digest's entry as a trim sees it.
type Entry struct {
	Digest   string // 64 hex digits
	Bytes    int64  // on disk: the file, its stamp and its unpacked tree
	LastUsed time.Time
}

func (c *Cache) entries() ([]Entry, error) {
	names, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Entry
	for _, e := range names {
		digest := digestOf(e.Name())
		if digest == "" || seen[digest] {
			continue
		}
		seen[digest] = true
		out = append(out, c.measure(digest))
	}
	for digest := range c.sizes {
		if !seen[digest] {
			delete(c.sizes, digest)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if d := a.LastUsed.Compare(b.LastUsed); d != 0 {
			return d
		}
		return strings.Compare(a.Digest, b.Digest)
	})
	return out, nil
}

// digestOf is the digest a name in the cache belongs to, "" for a name
// that is no entry's (a partial write the runtime is making: .part-…).
func digestOf(name string) string {
	name = strings.TrimPrefix(name, ".")
	for _, s := range []string{lockSuffix, useSuffix, stampSuffix, treeSuffix} {
		name = strings.TrimSuffix(name, s)
	}
	if len(name) != 64 || strings.Trim(name, "0123456789abcdef") != "" {
		return ""
	}
	return name
}

// measure is an entry's size and last use: the latest modification time
// of its use file (touched at every load), its file or its tree. Access
// times are no use here: with relatime (the default) a read updates them
// at most once a day.
func (c *Cache) measure(digest string) Entry {
	e := Entry{Digest: digest}
	base := filepath.Join(c.dir, digest)
	var id sized
	for _, p := range []string{base, base + treeSuffix, c.lockName(digest, useSuffix)} {
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if st.ModTime().After(e.LastUsed) {
			e.LastUsed = st.ModTime()
		}
		switch p {
		case base:
			id.file = idOf(st)
		case base + treeSuffix:
			id.tree = idOf(st)
		}
	}
	if known, ok := c.sizes[digest]; ok && known.file == id.file && known.tree == id.tree {
		e.Bytes = known.bytes
		return e
	}
	for _, p := range []string{base, base + stampSuffix, base + treeSuffix + stampSuffix} {
		e.Bytes += onDisk(p)
	}
	filepath.WalkDir(base+treeSuffix, func(path string, d fs.DirEntry, err error) error {
		if err == nil {
			e.Bytes += onDisk(path)
		}
		return nil
	})
	id.bytes = e.Bytes
	c.sizes[digest] = id
	return e
}

// idOf tells one version of a file from another: the runtime puts a new
// file or tree in place by renaming it there, a new inode.
func idOf(st fs.FileInfo) fileID {
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	return fileID{ino, st.ModTime().UnixNano()}
}

// onDisk is what path takes on its file system (its blocks: a sparse file
// takes less than its size), 0 if it is not there.
func onDisk(path string) int64 {
	st, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return int64(sys.Blocks) * 512
	}
	return st.Size()
}

func (c *Cache) lockName(digest, suffix string) string {
	return filepath.Join(c.dir, "."+digest+suffix)
}

// Trimmed is what a trim removed, and what it had to keep.
type Trimmed struct {
	Removed      int
	RemovedBytes int64
	InUse        int   // entries over the bound kept because a call uses them
	Left         int64 // bytes the cache still holds
}

// Trim removes entries, least recently used first, while the cache holds
// more than limit bytes or short() says the disk is still short (nil:
// never), skipping every entry a call is loading or has loaded.
func (c *Cache) Trim(limit int64, short func() bool) (Trimmed, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	entries, err := c.entries()
	if err != nil {
		return Trimmed{}, err
	}
	var r Trimmed
	for _, e := range entries {
		r.Left += e.Bytes
	}
	for _, e := range entries {
		if r.Left <= limit && (short == nil || !short()) {
			break
		}
		removed, err := c.remove(e.Digest)
		if err != nil {
			return r, err
		}
		if !removed {
			r.InUse++
			continue
		}
		delete(c.sizes, e.Digest)
		r.Removed++
		r.RemovedBytes += e.Bytes
		r.Left -= e.Bytes
	}
	return r, nil
}

// remove removes one entry unless a call holds either of its locks; it
// says whether it did.
func (c *Cache) remove(digest string) (bool, error) {
	lock, ok, err := tryLock(c.lockName(digest, lockSuffix))
	if err != nil || !ok {
		return false, err
	}
	defer lock.Close()
	use, ok, err := tryLock(c.lockName(digest, useSuffix))
	if err != nil || !ok {
		return false, err
	}
	defer use.Close()
	base := filepath.Join(c.dir, digest)
	// The names sandboxed calls load it by first (Adopt), then the tree,
	// then the file and the stamps: a load that finds a part gone fetches
	// or unpacks again.
	for _, p := range c.shownNames(digest) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	if err := removeTree(base + treeSuffix); err != nil {
		return false, err
	}
	for _, p := range []string{base + treeSuffix + stampSuffix, base + stampSuffix, base, use.Name(), lock.Name()} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	return true, nil
}

// tryLock opens (creating it) and locks path exclusively without waiting;
// ok is false when another process holds it.
func tryLock(path string) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}

// removeTree removes an unpacked tree, which the runtime leaves read-only
// throughout: its directories are made writable first.
func removeTree(root string) error {
	if _, err := os.Lstat(root); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(root)
}

// shownDirName is the directory of the cache's entries that sandboxed
// calls are shown, beside <cache>/sha256 (worker_main.py's
// _shared_artifact).
const shownDirName = "shown"

// MakeShownDir makes the directory of root's entries that sandboxed calls
// are shown (root: the artifact cache, FLUKSIO_ARTIFACT_CACHE), mode 0311:
// a process without a capability may open a name in it, not list it.
func MakeShownDir(root string) error {
	dir := ShownDir(root)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	st, err := os.Lstat(dir)
	switch {
	case err != nil:
		return err
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case st.Mode().Perm() == 0o311:
		return nil
	}
	return os.Chmod(dir, 0o311)
}

// ShownDir is the directory of root's entries that sandboxed calls are
// shown (MakeShownDir).
func ShownDir(root string) string { return filepath.Join(root, shownDirName) }

// shownNames are the names of digest's entry in the shown directory: its
// file, its stamp and its use file, each a link to the cache's own.
func (c *Cache) shownNames(digest string) []string {
	dir := ShownDir(filepath.Dir(c.dir))
	return []string{filepath.Join(dir, digest), filepath.Join(dir, digest+stampSuffix), filepath.Join(dir, "."+digest+useSuffix)}
}
