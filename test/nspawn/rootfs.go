package nspawn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Suite is the Debian release the rootfs is built from.
const Suite = "bookworm"

// packages are what debootstrap adds to minbase: an init (systemd-sysv),
// dbus (systemctl talks to systemd through it for some verbs), python3,
// which the worker's package depends on, so apt installs a deb offline, and
// gpg, with which packaging/install.sh checks the repository's key (a
// machine without it gets it from its distribution first; this one has no
// mirror to reach).
var packages = []string{"systemd", "systemd-sysv", "dbus", "python3", "gpg"}

// DefaultCacheDir is where the rootfs is kept between runs when
// FLUKSIO_TEST_ROOTFS does not say otherwise.
const DefaultCacheDir = "/var/cache/fluksio-worker-test/bookworm"

// stampFile, inside the rootfs, records how it was built; a rootfs with a
// different stamp (say, an older package list) is rebuilt.
const stampFile = "/etc/fluksio-test-rootfs"

// CacheDir is where the rootfs lives: $FLUKSIO_TEST_ROOTFS, else
// DefaultCacheDir.
func CacheDir() string {
	if d := os.Getenv("FLUKSIO_TEST_ROOTFS"); d != "" {
		return d
	}
	return DefaultCacheDir
}

// Rootfs returns the cached Debian rootfs, building it first if it is
// missing or stale. Concurrent callers, in this process or in other test
// binaries, wait for one build. Never write into the returned tree: Boot
// works on a copy of it.
func Rootfs(ctx context.Context) (string, error) {
	if err := Available(); err != nil {
		return "", err
	}
	dir := CacheDir()
	mirror := Mirror()
	stamp := stampText(mirror)
	if current(dir, stamp) {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("rootfs cache: %w", err)
	}
	unlock, err := lock(ctx, dir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if current(dir, stamp) { // another process built it while we waited
		return dir, nil
	}
	if err := build(ctx, dir, mirror, stamp); err != nil {
		return "", err
	}
	return dir, nil
}

func stampText(mirror string) string {
	return fmt.Sprintf("debootstrap --variant=minbase --include=%s %s %s\n",
		strings.Join(packages, ","), Suite, mirror)
}

func current(dir, stamp string) bool {
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	return err == nil && string(b) == stamp
}

// build runs debootstrap into a temporary sibling of dir and renames it into
// place, so a build that is killed half way never leaves a tree that looks
// finished.
func build(ctx context.Context, dir, mirror, stamp string) error {
	parent := filepath.Dir(dir)
	// Leftovers of killed builds: only ever touched under the lock.
	old, _ := filepath.Glob(filepath.Join(parent, "."+filepath.Base(dir)+".build-*"))
	for _, o := range old {
		os.RemoveAll(o)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".build-")
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	defer os.RemoveAll(tmp)
	// MkdirTemp makes 0700; a container root that others cannot traverse
	// stops dbus (it runs as messagebus) and the boot stalls without a word.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	args := []string{"--variant=minbase", "--include=" + strings.Join(packages, ","), Suite, tmp, mirror}
	cmd := exec.CommandContext(ctx, "debootstrap", args...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("debootstrap %s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 4000))
	}
	if err := prepare(tmp, stamp); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if _, err := os.Stat(dir); err == nil {
		// Stale: move it aside first; rename cannot replace a directory.
		stale := tmp + ".stale"
		if err := os.Rename(dir, stale); err != nil {
			return fmt.Errorf("rootfs: replacing stale %s: %w", dir, err)
		}
		defer os.RemoveAll(stale)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}

// prepare makes the fresh tree quick to boot and quiet, then stamps it.
func prepare(root, stamp string) error {
	// Nothing here needs a login prompt on the console, and the package cache
	// only makes every copy bigger.
	for _, unit := range []string{"console-getty.service", "getty@.service", "systemd-networkd-wait-online.service"} {
		p := filepath.Join(root, "etc/systemd/system", unit)
		os.Remove(p)
		if err := os.Symlink("/dev/null", p); err != nil {
			return err
		}
	}
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	for _, d := range debs {
		os.Remove(d)
	}
	return os.WriteFile(filepath.Join(root, stampFile), []byte(stamp), 0o644)
}

// Mirror is the Debian mirror to build from: $FLUKSIO_TEST_MIRROR, else the
// first one this machine's apt uses for the suite, else deb.debian.org.
func Mirror() string {
	if m := os.Getenv("FLUKSIO_TEST_MIRROR"); m != "" {
		return m
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(append([]string{"/etc/apt/sources.list"}, files...), lists...)
	for _, f := range files {
		if m := mirrorIn(f); m != "" {
			return m
		}
	}
	return "http://deb.debian.org/debian"
}

// mirrorIn finds a URI serving Suite's main component, in either apt format:
// one-line ("deb URI SUITE main") or deb822 stanzas (URIs:, Suites:).
func mirrorIn(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var uris, suites []string
	stanza := func() string {
		for _, s := range suites {
			if s == Suite && len(uris) > 0 {
				return uris[0]
			}
		}
		uris, suites = nil, nil
		return ""
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		fields := strings.Fields(line)
		switch {
		case line == "":
			if m := stanza(); m != "" {
				return m
			}
		case strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "URIs:"):
			uris = fields[1:]
		case strings.HasPrefix(line, "Suites:"):
			suites = fields[1:]
		case fields[0] == "deb":
			// deb [opts] URI SUITE COMPONENTS...
			rest := fields[1:]
			if len(rest) > 0 && strings.HasPrefix(rest[0], "[") {
				for len(rest) > 0 && !strings.HasSuffix(rest[0], "]") {
					rest = rest[1:]
				}
				if len(rest) > 0 {
					rest = rest[1:]
				}
			}
			if len(rest) >= 2 && rest[1] == Suite {
				return rest[0]
			}
		}
	}
	return stanza()
}

// lock takes an exclusive flock on path, polling so ctx can end the wait.
func lock(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("rootfs lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("rootfs lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another rootfs build (%s): %w", path, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
