package runner

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// dirsRig is a config whose call directories are kept for reuse, as a
// pool's are.
func dirsRig(t *testing.T) *Config {
	t.Helper()
	state := t.TempDir()
	return &Config{StateDir: state, dirs: &callDirs{}}
}

// leaveMess writes into d what node code may leave: files, directories,
// a read-only directory with a file in it, a file without permissions, a
// link out of the directory, and the directory itself opened to others.
func leaveMess(t *testing.T, d *callDir, outside string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(d.path, "result.txt"), []byte("secret of the last call"), 0o644))
	must(os.MkdirAll(filepath.Join(d.path, "runs", "1"), 0o755))
	must(os.WriteFile(filepath.Join(d.path, "runs", "1", "checkpoint.pt"), []byte("x"), 0o600))
	must(os.Mkdir(filepath.Join(d.path, "locked"), 0o700))
	must(os.WriteFile(filepath.Join(d.path, "locked", "kept.txt"), []byte("x"), 0o600))
	must(os.Chmod(filepath.Join(d.path, "locked"), 0o500))
	must(os.WriteFile(filepath.Join(d.path, "unreadable"), []byte("x"), 0))
	must(os.Symlink(outside, filepath.Join(d.path, "link")))
	must(os.Chmod(d.path, 0o777))
}

// A call directory whose call is gone is emptied and handed to the next
// call: the same directory, with nothing of the last call left in it,
// private again; what a link in it pointed to is untouched.
func TestCallDirIsReusedEmptyAndPrivate(t *testing.T) {
	cfg := dirsRig(t)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "keep.txt"), []byte("not the call's"), 0o644)
	d, err := cfg.newCallDir()
	if err != nil {
		t.Fatal(err)
	}
	leaveMess(t, d, outside)
	if err := cfg.dirs.recycle(d, true); err != nil {
		t.Fatalf("recycle: %v", err)
	}
	next, err := cfg.newCallDir()
	if err != nil {
		t.Fatal(err)
	}
	if next.path != d.path {
		t.Fatalf("the next call got %s; want the emptied %s", next.path, d.path)
	}
	entries, err := os.ReadDir(next.path)
	if err != nil || len(entries) != 0 {
		t.Errorf("the reused directory holds %v (%v); want nothing", entries, err)
	}
	st, err := os.Lstat(next.path)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Errorf("the reused directory is %v (%v); want a directory with mode 0700", st.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep.txt")); err != nil {
		t.Errorf("emptying the call directory reached through a link: %v", err)
	}
	// Pool.Close removes what is kept.
	cfg.dirs.recycle(next, true)
	cfg.dirs.close()
	if _, err := os.Lstat(d.path); !os.IsNotExist(err) {
		t.Errorf("%s is left after close: %v", d.path, err)
	}
}

// A directory is not reused when its call's processes may still reach it,
// or when it is no longer a directory of its own (node code put a link in
// its place): it is removed, and the next call gets a new one.
func TestCallDirNotReused(t *testing.T) {
	t.Run("CallNotGone", func(t *testing.T) {
		cfg := dirsRig(t)
		d, _ := cfg.newCallDir()
		os.WriteFile(filepath.Join(d.path, "f"), []byte("x"), 0o644)
		if err := cfg.dirs.recycle(d, false); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d.path); !os.IsNotExist(err) {
			t.Errorf("%s is left: %v", d.path, err)
		}
		if next, _ := cfg.newCallDir(); next.path == d.path {
			t.Error("the next call got the directory of a call that may still run")
		}
	})
	t.Run("ReplacedByALink", func(t *testing.T) {
		cfg := dirsRig(t)
		outside := t.TempDir()
		os.WriteFile(filepath.Join(outside, "keep.txt"), []byte("not the call's"), 0o644)
		d, _ := cfg.newCallDir()
		os.Remove(d.path)
		if err := os.Symlink(outside, d.path); err != nil {
			t.Fatal(err)
		}
		cfg.dirs.recycle(d, true)
		if next, _ := cfg.newCallDir(); next.path == d.path {
			t.Error("the next call got a link in place of a call directory")
		}
		if _, err := os.Stat(filepath.Join(outside, "keep.txt")); err != nil {
			t.Errorf("what the link pointed to was touched: %v", err)
		}
		if _, err := os.Lstat(d.path); !os.IsNotExist(err) {
			t.Errorf("the link %s is left: %v", d.path, err)
		}
	})
}

// A directory reused again and again is emptied each time: what a call
// leaves after the first reuse is gone before the next call gets it.
func TestCallDirEmptiedAtEveryReuse(t *testing.T) {
	cfg := dirsRig(t)
	outside := t.TempDir()
	d, err := cfg.newCallDir()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		leaveMess(t, d, outside)
		if err := cfg.dirs.recycle(d, true); err != nil {
			t.Fatalf("recycle %d: %v", i, err)
		}
		next, err := cfg.newCallDir()
		if err != nil {
			t.Fatal(err)
		}
		if next.path != d.path {
			t.Fatalf("reuse %d got %s; want the emptied %s", i, next.path, d.path)
		}
		if entries, err := os.ReadDir(next.path); err != nil || len(entries) != 0 {
			t.Fatalf("reuse %d: the directory holds %v (%v); want nothing", i, entries, err)
		}
		d = next
	}
	cfg.dirs.recycle(d, true)
	cfg.dirs.close()
	if _, err := os.Lstat(d.path); !os.IsNotExist(err) {
		t.Errorf("%s is left after close: %v", d.path, err)
	}
}

// Node code that moves its call directory away and makes another of the
// same name, mode and owner in its place does not get that one reused:
// it is not the directory the worker made (and emptied before).
func TestCallDirReplacedByAnotherDirectoryIsNotReused(t *testing.T) {
	cfg := dirsRig(t)
	d, _ := cfg.newCallDir()
	if err := cfg.dirs.recycle(d, true); err != nil {
		t.Fatal(err)
	}
	d, _ = cfg.newCallDir()
	moved := d.path + "-moved"
	if err := os.Rename(d.path, moved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(moved) })
	if err := os.Mkdir(d.path, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(d.path, "planted"), []byte("x"), 0o644)
	cfg.dirs.recycle(d, true)
	if next, _ := cfg.newCallDir(); next.path == d.path {
		t.Error("the next call got a directory put in place of its call directory")
	}
	if _, err := os.Lstat(d.path); !os.IsNotExist(err) {
		t.Errorf("the directory put in its place is left: %v", err)
	}
}

// posixACL is an ACL as the kernel takes it in the system.posix_acl_*
// extended attributes (what setfacl writes): the owner, the group and
// others with no access, and user uid with full access.
func posixACL(uid uint32) []byte {
	const (
		version   = 2
		userObj   = 0x01
		user      = 0x02
		groupObj  = 0x04
		mask      = 0x10
		other     = 0x20
		undefined = 0xffffffff
	)
	b := binary.LittleEndian.AppendUint32(nil, version)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{{userObj, 7, undefined}, {user, 7, uid}, {groupObj, 0, undefined}, {mask, 7, undefined}, {other, 0, undefined}} {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// A directory node code gave an ACL (letting another user in, now or, as
// a default ACL, into what later calls create) or another owner is not
// reused: it is removed, and the next call gets a new one.
func TestCallDirWithAnACLOrAnotherOwnerIsNotReused(t *testing.T) {
	const stranger = 4242
	for _, tc := range []struct {
		name   string
		change func(path string) error
	}{
		{"AccessACL", func(path string) error { return unix.Setxattr(path, "system.posix_acl_access", posixACL(stranger), 0) }},
		{"DefaultACL", func(path string) error { return unix.Setxattr(path, "system.posix_acl_default", posixACL(stranger), 0) }},
		{"AnotherOwner", func(path string) error { return os.Lchown(path, stranger, stranger) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := dirsRig(t)
			d, err := cfg.newCallDir()
			if err != nil {
				t.Fatal(err)
			}
			// Reused once first, so that it is the directory the worker
			// knows (opened for listing), as after a first call.
			if err := cfg.dirs.recycle(d, true); err != nil {
				t.Fatal(err)
			}
			if d, _ = cfg.newCallDir(); !d.listed {
				t.Fatal("the first recycled directory was not reused")
			}
			if err := tc.change(d.path); errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM) {
				t.Skipf("cannot set it up here: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			cfg.dirs.recycle(d, true)
			if next, _ := cfg.newCallDir(); next.path == d.path {
				t.Errorf("the next call got the directory with %s", tc.name)
			}
			if _, err := os.Lstat(d.path); !os.IsNotExist(err) {
				t.Errorf("the directory with %s is left: %v", tc.name, err)
			}
		})
	}
}
