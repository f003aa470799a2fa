//go:build linux

package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// codeTree is a directory laid out as a warm runner's code: a sys.path
// entry with a module, a package, a file the runtime reported absent (a
// module that could shadow one found later on sys.path) and a data file
// a node writes to; the paths as the runtime reports them.
func codeTree(t *testing.T) (lib string, paths []reportedPath) {
	t.Helper()
	lib = t.TempDir()
	for rel, text := range map[string]string{"mod.py": "V = 1\n", "pkg/__init__.py": "V = 1\n", "data.log": ""} {
		path := filepath.Join(lib, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	paths = []reportedPath{
		{lib, true},
		{filepath.Join(lib, "mod.py"), true},
		{filepath.Join(lib, "pkg"), true},
		{filepath.Join(lib, "pkg", "__init__.py"), true},
		{filepath.Join(lib, "shadow.py"), false},
		{filepath.Join(lib, "site", "user", "x.py"), false},
	}
	return lib, paths
}

// startedNow is a runner's start time once the tree's own making is older
// than changeSlack, as for a runner started after the code was in place.
func startedNow(t *testing.T) time.Time {
	t.Helper()
	time.Sleep(2 * changeSlack)
	return time.Now()
}

// testWatcher is an inotify watcher of the test's own, closed with it:
// inotify instances are few (fs.inotify.max_user_instances) and shared by
// the user. The test is skipped where none can be had.
func testWatcher(t *testing.T) *changeWatcher {
	t.Helper()
	w := newChangeWatcher(true)
	if w.fd < 0 {
		t.Skip("no inotify instance here (fs.inotify.max_user_instances)")
	}
	t.Cleanup(func() { unix.Close(w.fd) })
	return w
}

// wantStale fails the test with what unless cw's runner is stale.
func wantStale(t *testing.T, w *changeWatcher, cw *codeWatch, what string) {
	t.Helper()
	if cw.staleness(w) == "" {
		t.Error(what)
	}
}

// wantFresh stops the test if cw's runner is stale.
func wantFresh(t *testing.T, w *changeWatcher, cw *codeWatch) {
	t.Helper()
	if why := cw.staleness(w); why != "" {
		t.Fatalf("stale before any change of code: %s", why)
	}
}

// polled lists cw's paths that no notification follows.
func polled(cw *codeWatch) []string {
	var paths []string
	for _, wp := range cw.paths {
		if !wp.followed {
			paths = append(paths, wp.path)
		}
	}
	return paths
}

// followedTree is codeTree followed by an inotify watcher of the test's,
// for a runner started now; the test runs in parallel.
func followedTree(t *testing.T) (*changeWatcher, string, *codeWatch) {
	t.Helper()
	t.Parallel()
	w := testWatcher(t)
	lib, paths := codeTree(t)
	return w, lib, w.follow(paths, startedNow(t))
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(text)
	f.Close()
}

// Each change a status check saw, the notifications see, with no path
// left to a status check; what does not change the code (a node writing
// a file in a directory on sys.path) leaves the runner fresh.
func TestCodeWatchFollowsChangesByNotification(t *testing.T) {
	t.Parallel()
	changes := map[string]func(t *testing.T, lib string){
		"a module edited in place": func(t *testing.T, lib string) {
			writeFile(t, filepath.Join(lib, "mod.py"), "V = 2\n")
		},
		"a package's file's mode changed": func(t *testing.T, lib string) {
			if err := os.Chmod(filepath.Join(lib, "pkg", "__init__.py"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"a module that shadows another created": func(t *testing.T, lib string) {
			writeFile(t, filepath.Join(lib, "shadow.py"), "")
		},
		"a directory on the way to an absent path made": func(t *testing.T, lib string) {
			if err := os.Mkdir(filepath.Join(lib, "site"), 0o755); err != nil {
				t.Fatal(err)
			}
		},
		"a package replaced as pip upgrades it": func(t *testing.T, lib string) {
			next := filepath.Join(lib, "pkg.new")
			os.Mkdir(next, 0o755)
			writeFile(t, filepath.Join(next, "__init__.py"), "V = 2\n")
			if err := os.RemoveAll(filepath.Join(lib, "pkg")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(next, filepath.Join(lib, "pkg")); err != nil {
				t.Fatal(err)
			}
		},
		"a file added to a package's directory": func(t *testing.T, lib string) {
			writeFile(t, filepath.Join(lib, "pkg", "extra.py"), "")
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := testWatcher(t)
			lib, paths := codeTree(t)
			cw := w.follow(paths, startedNow(t))
			if p := polled(cw); len(p) != 0 {
				t.Fatalf("paths left to a status check: %v", p)
			}
			// A node writing into a directory on sys.path is no change
			// of code.
			writeFile(t, filepath.Join(lib, "data.log"), "a line\n")
			wantFresh(t, w, cw)
			change(t, lib)
			wantStale(t, w, cw, "the change was not seen")
			w.release(cw)
			if len(w.nodes) != 0 || len(w.byPath) != 0 {
				t.Errorf("watches left after the last release: %d", len(w.nodes))
			}
		})
	}
}

// A change after the runner started and before its watches were in place
// is seen too: each path's status is read once they are.
func TestCodeWatchSeesAChangeBeforeItsWatches(t *testing.T) {
	t.Parallel()
	w := testWatcher(t)
	lib, paths := codeTree(t)
	began := startedNow(t)
	writeFile(t, filepath.Join(lib, "mod.py"), "V = 2\n")
	if why := w.follow(paths, began).staleness(w); why == "" {
		t.Error("a change between the runner's start and its watches was not seen")
	}
}

// A directory on the way to the code renamed away and another put in its
// place (an environment deployed anew) is other code at the same paths.
func TestCodeWatchSeesADirectoryOnTheWayReplaced(t *testing.T) {
	t.Parallel()
	w := testWatcher(t)
	env := filepath.Join(t.TempDir(), "venv")
	lib := filepath.Join(env, "lib", "site-packages")
	deploy := func(version string) {
		if err := os.MkdirAll(lib, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(lib, "mod.py"), "V = "+version+"\n")
	}
	deploy("1")
	cw := w.follow([]reportedPath{{lib, true}, {filepath.Join(lib, "mod.py"), true}}, startedNow(t))
	if p := polled(cw); len(p) != 0 {
		t.Fatalf("paths left to a status check: %v", p)
	}
	wantFresh(t, w, cw)
	if err := os.Rename(env, env+".old"); err != nil {
		t.Fatal(err)
	}
	deploy("2")
	wantStale(t, w, cw, "an environment deployed anew at the same path was not seen")
}

// While another runner's watches are being added (which holds the
// watcher for as long as the kernel takes to mark a big directory's
// entries), a call's check does not wait: it reads every path's status,
// and still sees a change.
func TestCodeWatchCheckDoesNotWaitForAnAddition(t *testing.T) {
	w, lib, cw := followedTree(t)
	w.adding.Add(1) // an addition in flight, holding the watcher
	w.mu.Lock()
	defer func() {
		w.mu.Unlock()
		w.adding.Add(-1)
	}()
	check := func() string {
		checked := make(chan string, 1)
		go func() { checked <- cw.staleness(w) }()
		select {
		case why := <-checked:
			return why
		case <-time.After(waitLong):
			t.Fatal("a call's check waited for another runner's watches to be added")
			return ""
		}
	}
	if why := check(); why != "" {
		t.Fatalf("stale before any change: %s", why)
	}
	writeFile(t, filepath.Join(lib, "mod.py"), "V = 2\n")
	if check() == "" {
		t.Error("a change was not seen while the notifications could not be read")
	}
}

// Without inotify (no instance could be had), every path is followed by
// status, and changes are still seen.
func TestCodeWatchWithoutNotifications(t *testing.T) {
	t.Parallel()
	for _, change := range []func(lib string){
		func(lib string) { writeFile(t, filepath.Join(lib, "mod.py"), "V = 2\n") },
		func(lib string) { writeFile(t, filepath.Join(lib, "shadow.py"), "") },
	} {
		w := newChangeWatcher(false)
		lib, paths := codeTree(t)
		cw := w.follow(paths, startedNow(t))
		if p := polled(cw); len(p) != len(paths) {
			t.Fatalf("%d of %d paths followed by status", len(p), len(paths))
		}
		wantFresh(t, w, cw)
		change(lib)
		wantStale(t, w, cw, "the change was not seen by status")
	}
}

// A path through a symbolic link is followed by status: a watch would
// follow the link's target, not the link pointed elsewhere.
func TestCodeWatchFollowsLinksByStatus(t *testing.T) {
	t.Parallel()
	w := testWatcher(t)
	lib, paths := codeTree(t)
	other := t.TempDir()
	writeFile(t, filepath.Join(other, "mod.py"), "V = 3\n")
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(lib, link); err != nil {
		t.Fatal(err)
	}
	linked := reportedPath{filepath.Join(link, "mod.py"), true}
	cw := w.follow(append(paths, linked), startedNow(t))
	if p := polled(cw); len(p) != 1 || p[0] != linked.path {
		t.Fatalf("followed by status: %v; want only %s", p, linked.path)
	}
	// Pointed elsewhere, as a deployment that switches versions does.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	wantStale(t, w, cw, "a link pointed at other code was not seen")
}

// A zygote's code is held by the spares it forks: its watches stay while
// any of them does, and go with the last.
func TestCodeWatchHeldUntilTheLastRelease(t *testing.T) {
	w, lib, zygote := followedTree(t)
	if !w.hold(zygote) {
		t.Fatal("a held code watch refused a fork")
	}
	w.release(zygote) // the zygote is discarded; its fork waits on
	writeFile(t, filepath.Join(lib, "mod.py"), "V = 2\n")
	wantStale(t, w, zygote, "the fork's code changed unseen after its zygote went")
	w.release(zygote)
	if len(w.nodes) != 0 {
		t.Errorf("%d watches left after the last release", len(w.nodes))
	}
	if w.hold(zygote) {
		t.Error("a released code watch was held again")
	}
}

// BenchmarkStaleness: a warm call's freshness check of a runner whose
// code came from 150 paths (a plain interpreter's runtime reports about
// as many), with inotify and by status alone:
//
//	go test ./agent/runner -run '^$' -bench Staleness
func BenchmarkStaleness(b *testing.B) {
	lib := b.TempDir()
	paths := []reportedPath{{lib, true}}
	for d := range 30 {
		dir := filepath.Join(lib, fmt.Sprintf("pkg%d", d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		paths = append(paths, reportedPath{dir, true})
		for f := range 4 {
			path := filepath.Join(dir, fmt.Sprintf("mod%d.py", f))
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				b.Fatal(err)
			}
			paths = append(paths, reportedPath{path, true})
		}
	}
	time.Sleep(2 * changeSlack)
	for _, inotify := range []bool{true, false} {
		b.Run(fmt.Sprintf("inotify=%v", inotify), func(b *testing.B) {
			w := newChangeWatcher(inotify)
			if inotify && w.fd < 0 {
				b.Skip("no inotify instance here (fs.inotify.max_user_instances)")
			}
			if w.fd >= 0 {
				defer unix.Close(w.fd)
			}
			cw := w.follow(paths, time.Now())
			defer w.release(cw)
			for b.Loop() {
				if why := cw.staleness(w); why != "" {
					b.Fatal(why)
				}
			}
		})
	}
}
