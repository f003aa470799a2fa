//go:build linux

package artifacts

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Adopt takes into the cache what a sandboxed call fetched into its own
// (own: the call's FLUKSIO_ARTIFACT_CACHE, in its call directory), once
// the call's processes are gone. In a sandbox, calls cannot write the
// cache, so that none can plant bytes under a digest for the next: a call
// caches what it fetches for itself, and the worker takes in each file
// whose bytes have its digest. Calls load it from the cache's shown
// directory (ShownDir), which the sandbox shows them read-only: each
// entry is linked there by name, and calls, having no capability, may
// open a name there but not list them (its mode is 0311), so a call loads
// what it knows the digest of and learns nothing of what other calls
// loaded. The use files the call left (a load of an entry of this cache,
// worker_main.py's _shared_artifact) mark those entries used. It returns
// how many files it took in. Nothing of the call's is trusted but bytes
// that hash to their name: a link, a file with other names (hard links)
// or anything else is left, and goes with the call's directory.
func (c *Cache) Adopt(own string) int {
	own = filepath.Join(own, "sha256")
	names, err := os.ReadDir(own)
	if err != nil {
		return 0
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil || MakeShownDir(filepath.Dir(c.dir)) != nil {
		return 0
	}
	took := 0
	for _, e := range names {
		digest := digestOf(e.Name())
		switch e.Name() {
		case digest:
			if c.adopt(filepath.Join(own, digest), digest) {
				took++
			}
		case "." + digest + useSuffix:
			c.markUsed(digest)
		}
	}
	return took
}

// adopt puts the file at src in the cache as digest's entry, unless an
// entry is there whose stamp still holds or its bytes are not digest's.
// It holds the digest's lock meanwhile, as the runtime does to fetch.
func (c *Cache) adopt(src, digest string) bool {
	lock, ok, err := tryLock(c.lockName(digest, lockSuffix))
	if err != nil || !ok {
		return false
	}
	final := filepath.Join(c.dir, digest)
	defer func() {
		// A lock file of no entry goes, while held (as Trim's remove does).
		if _, err := os.Lstat(final); errors.Is(err, os.ErrNotExist) {
			os.Remove(lock.Name())
		}
		lock.Close()
	}()
	if stamped(final) {
		// Verified already (a worker without a sandbox fetched it): shown
		// now, if it was not.
		if _, err := os.Lstat(c.shownNames(digest)[1]); err != nil {
			c.show(digest)
		}
		return false
	}
	f, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return false
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil || hex.EncodeToString(h.Sum(nil)) != digest {
		return false
	}
	// The call's file is the cache's now: read-only, the worker's own,
	// moved in (its call directory is on the state directory's file
	// system, as the cache mostly is) or copied.
	if f.Chmod(0o444) != nil || (int(st.Uid) != os.Getuid() && f.Chown(os.Getuid(), os.Getgid()) != nil) {
		return false
	}
	if err := os.Rename(src, final); errors.Is(err, syscall.EXDEV) {
		err = copyIn(f, final)
		if err != nil {
			return false
		}
	} else if err != nil {
		return false
	}
	return c.show(digest)
}

// show links digest's entry, its file verified, into the shown directory,
// stamped anew and marked used; the caller holds the digest's lock. What
// it could not do whole, it removes, the file included.
func (c *Cache) show(digest string) bool {
	final := filepath.Join(c.dir, digest)
	c.markUsed(digest)
	// Linked before the stamp is written: a new name changes the file's
	// ctime, which the stamp holds.
	shown := c.shownNames(digest)
	for _, p := range shown {
		os.Remove(p)
	}
	if os.Link(final, shown[0]) == nil && os.Link(c.lockName(digest, useSuffix), shown[2]) == nil &&
		writeStamp(final) == nil && os.Link(final+stampSuffix, shown[1]) == nil {
		return true
	}
	for _, p := range append(shown, final+stampSuffix, final) {
		os.Remove(p)
	}
	return false
}

// copyIn writes what f holds to final through a partial file beside it.
func copyIn(f *os.File, final string) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	part, err := os.CreateTemp(filepath.Dir(final), ".part-")
	if err != nil {
		return err
	}
	_, err = io.Copy(part, f)
	if err == nil {
		err = part.Chmod(0o444)
	}
	if cerr := part.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(part.Name(), final)
	}
	if err != nil {
		os.Remove(part.Name())
	}
	return err
}

// markUsed touches the use file of digest's entry, where there is one:
// its last use, which Trim removes the least recent of first.
func (c *Cache) markUsed(digest string) {
	if _, err := os.Lstat(filepath.Join(c.dir, digest)); err != nil {
		return
	}
	use, err := os.OpenFile(c.lockName(digest, useSuffix), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return
	}
	now := time.Now()
	os.Chtimes(use.Name(), now, now)
	use.Close()
}

// stampOf is a file's stamp as the runtime writes it (worker_main.py's
// _stat_stamp): the inode, size, modification and change times and mode,
// which any write, chmod or replacement of the file changes.
func stampOf(st *unix.Stat_t) string {
	return fmt.Sprintf("%d %d %d %d %o", st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), st.Mode)
}

// stamped reports whether path is a regular file its stamp still holds for.
func stamped(path string) bool {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	b, err := os.ReadFile(path + stampSuffix)
	return err == nil && string(b) == stampOf(&st)
}

// writeStamp writes path's stamp beside it (through a partial file).
func writeStamp(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	part, err := os.CreateTemp(filepath.Dir(path), ".stamp-")
	if err != nil {
		return err
	}
	_, err = part.WriteString(stampOf(&st))
	if cerr := part.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(part.Name(), path+stampSuffix)
	}
	if err != nil {
		os.Remove(part.Name())
	}
	return err
}
