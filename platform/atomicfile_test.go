package platform

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(path, []byte("new"), 0o600, KeepOwner); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "new" {
		t.Errorf("after the write: %q, %v", b, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v; want 0600, whatever the old file had", fi.Mode().Perm())
	}
	// Written as the owner it already is: still the same user.
	own := Owner{os.Getuid(), os.Getgid()}
	if err := WriteFileAtomic(path, []byte("again"), 0o640, own); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries; want the file alone, no temporary file", len(entries))
	}
}

// A write that cannot happen says which file, and leaves nothing behind.
func TestWriteFileAtomicFails(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "f")
	err := WriteFileAtomic(missing, []byte("x"), 0o600, KeepOwner)
	if err == nil || !strings.Contains(err.Error(), "writing "+missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("writing into a missing directory: %v", err)
	}
	// A path that is a directory: the rename fails; no temporary file stays.
	dir := t.TempDir()
	target := filepath.Join(dir, "taken")
	os.Mkdir(target, 0o700)
	os.WriteFile(filepath.Join(target, "inside"), nil, 0o600)
	if err := WriteFileAtomic(target, []byte("x"), 0o600, KeepOwner); err == nil {
		t.Error("replacing a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("a failed write left %d entries; want the directory alone", len(entries))
	}
}
