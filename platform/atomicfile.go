package platform

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Owner is who a file written by WriteFileAtomic belongs to; -1 keeps the
// writer's user or group.
type Owner struct{ UID, GID int }

// KeepOwner leaves a new file to the user and group writing it.
var KeepOwner = Owner{-1, -1}

// WriteFileAtomic replaces path with data; see CopyFileAtomic.
func WriteFileAtomic(path string, data []byte, mode fs.FileMode, owner Owner) error {
	return CopyFileAtomic(path, bytes.NewReader(data), mode, owner)
}

// CopyFileAtomic replaces path with what r holds: a temporary file in the
// same directory is given its mode and owner, written, synced, and only
// then renamed over path, and the directory is synced. A reader sees the
// old file or the new one, whole and already protected (the temporary file
// is 0600 from its creation); a full disk or a crash leaves the old one.
func CopyFileAtomic(path string, r io.Reader, mode fs.FileMode, owner Owner) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("writing %s: %w", path, err)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if owner.UID >= 0 || owner.GID >= 0 {
		if err := f.Chown(owner.UID, owner.GID); err != nil {
			return err
		}
	}
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// The rename is durable only once the directory is synced.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// Unchanged reports whether now is still the file was: the same file
// (device and inode), size, modification and change time. A file replaced
// (a rename over it, an upgrade) or rewritten is not, even one whose
// modification time was set back.
func Unchanged(now, was fs.FileInfo) bool {
	return now != nil && was != nil && os.SameFile(now, was) && now.Size() == was.Size() &&
		now.ModTime().Equal(was.ModTime()) && changeTime(now) == changeTime(was)
}
