package runner

// Change notifications for freshness (fresh.go), with inotify: one
// instance for the process, shared by every warm runner, its watches
// counted so that a directory or file followed for several runners is
// watched once and unwatched after the last.
//
// What a path's status check saw, a notification sees:
//   - a file edited in place, its mode or owner changed, a link made to it
//     (its change time): a watch on the file itself;
//   - a directory's entries added, removed or renamed (its change time): a
//     watch on the directory;
//   - a path created, removed or replaced (pip's upgrade, a module that
//     shadows another): its directory's watch, naming it; where it did not
//     exist, the watch of its nearest existing ancestor, naming the next
//     component, so creating any directory on the way to it counts;
//   - a directory on the way to a path replaced (a virtual environment
//     moved aside and deployed anew): the path now names another file,
//     which the status check saw by its change time; here each ancestor's
//     watch names the next component, up to /.
//
// A directory's watch does not report writes to its files, so a node that
// writes into a directory on sys.path (its working directory) queues
// nothing. The kernel queues an event before the change's system call
// returns, and each check reads the queue first: a change made before a
// call's request arrived is seen by that call's check.
//
// Followed by status instead: a path through a symbolic link (the link
// could be pointed elsewhere, and a watch follows the target), a path on a
// file system where changes may come from elsewhere without an event
// (NFS, CIFS, FUSE and every type not known to be local), and a path whose
// watch cannot be added (fs.inotify.max_user_watches reached); every path
// where the process cannot have an inotify instance (max_user_instances).
// An overflowing queue marks every runner stale.

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchMask is what a followed file or directory reports: a change of its
// own (content, attributes, removal, rename) or of its directory entries.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_DONT_FOLLOW

// entryEvents change a directory's entries.
const entryEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO

// localFileSystems are those whose every change goes through this kernel,
// so inotify reports it (statfs's f_type). ZFS has no constant in unix.
var localFileSystems = map[int64]bool{
	unix.EXT4_SUPER_MAGIC: true, unix.XFS_SUPER_MAGIC: true, unix.BTRFS_SUPER_MAGIC: true,
	unix.TMPFS_MAGIC: true, unix.OVERLAYFS_SUPER_MAGIC: true, unix.F2FS_SUPER_MAGIC: true,
	unix.SQUASHFS_MAGIC: true, unix.RAMFS_MAGIC: true, unix.EROFS_SUPER_MAGIC_V1: true,
	0x2fc12fc1: true, // ZFS
}

// changeWatcher owns the inotify instance and what each watch is for. Its
// mutex guards everything, and every codeWatch's refs and interests.
type changeWatcher struct {
	// adding counts the additions in flight (add), which hold mu for as
	// long as adding their watches takes: tens of milliseconds for a
	// directory with many entries cached (/tmp), as the kernel marks each.
	adding atomic.Int32
	mu     sync.Mutex
	fd     int // -1: no instance; every path is followed by status
	nodes  map[int32]*watchedNode
	byPath map[string]*watchedNode
	buf    []byte
}

// watchedNode is one watched file or directory.
type watchedNode struct {
	wd    int32
	path  string
	users int  // interests in it
	gone  bool // the kernel removed its watch (IN_IGNORED)
	// self: any event of the node itself; names: an event naming one of
	// its entries; entries: any entry added, removed or renamed.
	self    []*codeWatch
	names   map[string][]*codeWatch
	entries []*codeWatch
}

// interest is one way a codeWatch listens to a node, to undo on release.
type interest struct {
	node *watchedNode
	kind byte // 's' self, 'n' name, 'e' entries
	name string
}

// systemChanges is the process's watcher: made at the first use, never
// closed (it lives as long as warm runners can).
var systemChanges = sync.OnceValue(func() *changeWatcher {
	return newChangeWatcher(true)
})

// newChangeWatcher makes a watcher; without inotify (or if the system
// refuses an instance) every path is followed by status.
func newChangeWatcher(inotify bool) *changeWatcher {
	w := &changeWatcher{fd: -1, nodes: map[int32]*watchedNode{}, byPath: map[string]*watchedNode{}}
	if inotify {
		if fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC); err == nil {
			w.fd = fd
			w.buf = make([]byte, 16<<10)
		}
	}
	return w
}

// add follows paths for cw where it can, and returns the others.
func (w *changeWatcher) add(cw *codeWatch, paths []reportedPath) (unfollowed []reportedPath) {
	if w.fd < 0 {
		return paths
	}
	w.adding.Add(1)
	defer w.adding.Add(-1)
	w.mu.Lock()
	defer w.mu.Unlock()
	// What changed before is no concern of this runner's: the status
	// check after its watches are in place covers its start.
	w.syncLocked()
	seen := &addition{plain: map[string]bool{}, named: map[string]bool{}}
	for _, rp := range paths {
		if !w.addLocked(cw, rp, seen) {
			unfollowed = append(unfollowed, rp)
		}
	}
	return unfollowed
}

// addition is what one runner's paths share as they are added.
type addition struct {
	plain map[string]bool // directories reached without a link, or not
	named map[string]bool // directory "\x00" entry: listened to already
}

// addLocked follows one path for cw; false if it cannot be followed.
func (w *changeWatcher) addLocked(cw *codeWatch, rp reportedPath, seen *addition) bool {
	path := rp.path
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return false
	}
	var st unix.Stat_t
	exists := unix.Lstat(path, &st) == nil
	if exists != rp.existed || exists && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return false
	}
	dir, name := filepath.Dir(path), filepath.Base(path)
	if !exists {
		// The nearest existing ancestor, naming the next component.
		for unix.Lstat(dir, &st) != nil {
			if dir == "/" {
				return false
			}
			dir, name = filepath.Dir(dir), filepath.Base(dir)
		}
	}
	if !w.plain(dir, seen.plain) {
		return false
	}
	// The path's entry in its directory, and each directory's on the way
	// up: a directory on the way renamed away and another put in its
	// place (a virtual environment deployed anew) is other code at the
	// same path, and no watch below it would say so.
	for {
		if key := dir + "\x00" + name; !seen.named[key] {
			parent := w.nodeLocked(dir)
			if parent == nil {
				return false
			}
			w.listenLocked(cw, interest{node: parent, kind: 'n', name: name})
			seen.named[key] = true
		}
		if dir == "/" {
			break
		}
		dir, name = filepath.Dir(dir), filepath.Base(dir)
	}
	if !exists {
		return true
	}
	node := w.nodeLocked(path)
	if node == nil {
		return false
	}
	w.listenLocked(cw, interest{node: node, kind: 's'})
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		w.listenLocked(cw, interest{node: node, kind: 'e'})
	}
	return true
}

// plain reports whether dir is reached without a symbolic link, cached
// in seen for one runner's paths.
func (w *changeWatcher) plain(dir string, seen map[string]bool) bool {
	ok, known := seen[dir]
	if !known {
		resolved, err := filepath.EvalSymlinks(dir)
		ok = err == nil && resolved == dir
		seen[dir] = ok
	}
	return ok
}

// nodeLocked is the watch of path, added if needed; nil if it cannot be
// watched.
func (w *changeWatcher) nodeLocked(path string) *watchedNode {
	if n := w.byPath[path]; n != nil {
		return n
	}
	var fs unix.Statfs_t
	if unix.Statfs(path, &fs) != nil || !localFileSystems[int64(fs.Type)] {
		return nil
	}
	wd, err := unix.InotifyAddWatch(w.fd, path, watchMask)
	if err != nil {
		return nil // fs.inotify.max_user_watches, most likely
	}
	n := w.nodes[int32(wd)]
	if n == nil { // else the same inode by another path (a bind mount)
		n = &watchedNode{wd: int32(wd), path: path, names: map[string][]*codeWatch{}}
		w.nodes[n.wd] = n
	}
	w.byPath[path] = n
	return n
}

func (w *changeWatcher) listenLocked(cw *codeWatch, in interest) {
	n := in.node
	switch in.kind {
	case 's':
		n.self = append(n.self, cw)
	case 'e':
		n.entries = append(n.entries, cw)
	case 'n':
		n.names[in.name] = append(n.names[in.name], cw)
	}
	n.users++
	cw.interests = append(cw.interests, in)
}

// hold adds a runner to cw (a spare forked from the zygote cw is for);
// false once cw was released by all: nothing follows it any more.
func (w *changeWatcher) hold(cw *codeWatch) bool {
	if w == nil {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cw.refs == 0 {
		return false
	}
	cw.refs++
	return true
}

// release drops a runner from cw; after the last, its watches go.
func (w *changeWatcher) release(cw *codeWatch) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cw.refs--; cw.refs > 0 {
		return
	}
	drop := func(list []*codeWatch) []*codeWatch {
		for i, x := range list {
			if x == cw {
				return append(list[:i], list[i+1:]...)
			}
		}
		return list
	}
	for _, in := range cw.interests {
		n := in.node
		switch in.kind {
		case 's':
			n.self = drop(n.self)
		case 'e':
			n.entries = drop(n.entries)
		case 'n':
			if l := drop(n.names[in.name]); len(l) > 0 {
				n.names[in.name] = l
			} else {
				delete(n.names, in.name)
			}
		}
		if n.users--; n.users == 0 {
			w.forgetLocked(n)
			if !n.gone {
				unix.InotifyRmWatch(w.fd, uint32(n.wd))
			}
		}
	}
	cw.interests = nil
}

// forgetLocked drops n from the maps (its watch is gone or going).
func (w *changeWatcher) forgetLocked(n *watchedNode) {
	if w.nodes[n.wd] == n {
		delete(w.nodes, n.wd)
	}
	for path, x := range w.byPath {
		if x == n {
			delete(w.byPath, path)
		}
	}
}

// sync reads what changed so far and marks the runners it concerns. It
// reports false where it could not: without inotify, or while watches are
// being added, which a call does not wait for (its check reads every
// path's status instead).
func (w *changeWatcher) sync() bool {
	if w == nil || w.fd < 0 {
		return false
	}
	if !w.mu.TryLock() {
		if w.adding.Load() > 0 {
			return false
		}
		w.mu.Lock()
	}
	w.syncLocked()
	w.mu.Unlock()
	return true
}

func (w *changeWatcher) syncLocked() {
	for {
		n, err := unix.Read(w.fd, w.buf)
		if err == unix.EINTR {
			continue
		}
		if n <= 0 {
			return // EAGAIN: nothing more queued
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := w.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, c := range raw {
					if c == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			w.eventLocked(ev.Wd, ev.Mask, name)
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// eventLocked marks the runners one event concerns.
func (w *changeWatcher) eventLocked(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		for _, n := range w.nodes {
			n.markAll("more changed than the worker could follow")
		}
		return
	}
	n := w.nodes[wd]
	if n == nil {
		return
	}
	if name == "" {
		// The node itself: changed, removed, renamed, its watch gone.
		n.markAll("changed since it started: " + n.path)
		if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED|unix.IN_UNMOUNT) != 0 {
			// Its path is another inode now, or none: a later runner
			// watches that afresh.
			for path, x := range w.byPath {
				if x == n {
					delete(w.byPath, path)
				}
			}
		}
		if mask&unix.IN_IGNORED != 0 {
			n.gone = true
			delete(w.nodes, wd)
		}
		return
	}
	for _, cw := range n.names[name] {
		cw.markStale("changed since it started: " + filepath.Join(n.path, name))
	}
	if mask&entryEvents != 0 {
		for _, cw := range n.entries {
			cw.markStale("an entry was added, removed or renamed since it started: " + n.path)
		}
	}
}

// markAll marks every runner listening to n.
func (n *watchedNode) markAll(why string) {
	for _, cw := range n.self {
		cw.markStale(why)
	}
	for _, cw := range n.entries {
		cw.markStale(why)
	}
	for _, l := range n.names {
		for _, cw := range l {
			cw.markStale(why)
		}
	}
}
