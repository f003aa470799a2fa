package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/policy"
)

// nobody is a uid that is neither root nor the test's: another local user.
const nobody = 65534

// TestTrustKeysOthersMayWriteAreRefused: a --trust-key file or directory,
// a *.pub in it, or a directory above it that a user other than root and
// the worker's may write or owns is refused at start (a usage error: exit
// 2), saying what to change; the same keys kept private are read.
func TestTrustKeysOthersMayWriteAreRefused(t *testing.T) {
	root := os.Geteuid() == 0
	for _, tc := range []struct {
		name      string
		needsRoot bool
		setup     func(t *testing.T, top, keys, pub string) string // returns the --trust-key path
		says      []string
	}{
		{"private keys are read", false, func(t *testing.T, top, keys, pub string) string { return keys }, nil},
		{"a key file at 0666", false, func(t *testing.T, top, keys, pub string) string { chmod(t, pub, 0o666); return pub },
			[]string{"--trust-key " + "PUB", "mode 0666", "chmod go-w PUB"}},
		{"a *.pub at 0666 in the directory", false, func(t *testing.T, top, keys, pub string) string { chmod(t, pub, 0o666); return keys },
			[]string{"--trust-key PUB", "mode 0666"}},
		{"a directory at 0777", false, func(t *testing.T, top, keys, pub string) string { chmod(t, keys, 0o777); return keys },
			[]string{"--trust-key KEYS", "mode 0777", "chmod go-w KEYS"}},
		{"a directory at 01777 (sticky does not stop a new key)", false, func(t *testing.T, top, keys, pub string) string {
			chmod(t, keys, 0o1777)
			return keys
		}, []string{"mode 0777"}},
		{"a directory at 0775", false, func(t *testing.T, top, keys, pub string) string { chmod(t, keys, 0o775); return keys },
			[]string{"mode 0775"}},
		{"inside a directory every user may write", false, func(t *testing.T, top, keys, pub string) string { chmod(t, top, 0o777); return keys },
			[]string{"--trust-key KEYS is inside TOP", "every user may write"}},
		{"inside a directory its group may write", false, func(t *testing.T, top, keys, pub string) string { chmod(t, top, 0o770); return pub },
			[]string{"is inside TOP", "group", "chmod g-w TOP"}},
		{"a directory another user owns", true, func(t *testing.T, top, keys, pub string) string { chown(t, keys); return keys },
			[]string{"--trust-key KEYS", "belongs to uid 65534", "chown"}},
		{"a *.pub another user owns", true, func(t *testing.T, top, keys, pub string) string { chown(t, pub); return keys },
			[]string{"--trust-key PUB", "belongs to uid 65534"}},
		{"inside a directory another user owns", true, func(t *testing.T, top, keys, pub string) string { chown(t, top); return pub },
			[]string{"is inside TOP", "belongs to uid 65534"}},
		{"a link to a key another user may replace", true, func(t *testing.T, top, keys, pub string) string {
			elsewhere := filepath.Join(t.TempDir(), "theirs")
			if err := os.Mkdir(elsewhere, 0o755); err != nil {
				t.Fatal(err)
			}
			chown(t, elsewhere)
			if err := os.Rename(pub, filepath.Join(elsewhere, "owner.pub")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(elsewhere, "owner.pub"), pub); err != nil {
				t.Fatal(err)
			}
			return keys
		}, []string{"belongs to uid 65534"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needsRoot && !root {
				t.Skip("needs root to give a file to another user")
			}
			top := filepath.Join(t.TempDir(), "etc")
			keys := filepath.Join(top, "keys")
			if err := os.MkdirAll(keys, 0o755); err != nil {
				t.Fatal(err)
			}
			chmod(t, top, 0o755)
			if _, err := policy.GenerateKey(filepath.Join(keys, "owner")); err != nil {
				t.Fatal(err)
			}
			os.Remove(filepath.Join(keys, "owner")) // the private key stays off a worker
			pub := filepath.Join(keys, "owner"+policy.PublicKeySuffix)
			chmod(t, pub, 0o644)
			c := DefaultConfig()
			c.AllowSource, c.TrustKeys = policy.SourceSigned, []string{tc.setup(t, top, keys, pub)}
			err := c.resolvePolicy()
			if tc.says == nil {
				if err != nil {
					t.Fatalf("private keys refused: %v", err)
				}
				return
			}
			var usage *UsageError
			if !errors.As(err, &usage) {
				t.Fatalf("want a usage error (exit 2), got %v", err)
			}
			for _, want := range tc.says {
				want = strings.NewReplacer("PUB", pub, "KEYS", keys, "TOP", top).Replace(want)
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not say %q: %v", want, err)
				}
			}
		})
	}
}

// TestHookProgramsOthersMayWriteAreRefused: a hook's program (or the
// script its shell or interpreter runs) that a user other than root and
// the worker's may change is refused at start, as are the keys.
func TestHookProgramsOthersMayWriteAreRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hooks")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		chmod(t, p, mode)
		return p
	}
	good, loose := script("gpu-free.sh", 0o755), script("loose.sh", 0o777)
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	chmod(t, shared, 0o777)
	for _, tc := range []struct {
		pre, post string
		says      string // "" when it starts
	}{
		{good, "", ""},
		{"cat > /dev/null; echo 'GPU 0 is busy' >&2; exit 1", "find /scratch -mindepth 1 -delete", ""},
		{"python3 -c 'import sys'", "", ""},
		{loose, "", "the --pre-call-hook program " + loose + ": " + loose + " is mode 0777"},
		{"", "FOO=1 '" + loose + "' --now", "the --post-call-hook program " + loose},
		{"sh " + loose, "", "the --pre-call-hook program " + loose},
		{"", "/bin/sh -e " + loose + " && true", "the --post-call-hook program " + loose},
		{filepath.Join(shared, "missing.sh"), "", "is inside " + shared + ", which every user may write"},
		{"", filepath.Join(shared, "not-yet", "clean.sh"), "is inside " + shared + ", which every user may write"},
	} {
		c := DefaultConfig()
		c.PreCallHook, c.PostCallHook = tc.pre, tc.post
		err := c.resolvePolicy()
		switch {
		case tc.says == "" && err != nil:
			t.Errorf("hooks %q, %q refused: %v", tc.pre, tc.post, err)
		case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("hooks %q, %q: want a refusal saying %q, got %v", tc.pre, tc.post, tc.says, err)
		}
	}
	if os.Geteuid() == 0 {
		chown(t, good)
		c := DefaultConfig()
		c.PreCallHook = good
		if err := c.resolvePolicy(); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("a hook another user owns: %v", err)
		}
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if mode&0o1000 != 0 {
		mode = mode&0o777 | os.ModeSticky
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string) {
	t.Helper()
	if err := os.Lchown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}
