package platform

import (
	"bytes"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Calls' cgroups reused. Making a cgroup (mkdir in the cgroup hierarchy)
// and removing it (rmdir, which the kernel refuses until it let go of the
// exited processes) cost about a sixth of the worker's own CPU per call
// dispatching short calls eight at once. A cgroup found empty after its
// call may serve a later call instead, as call directories do, where
// nothing of the call changed it: node code that may write its own cgroup
// (root, or a delegated worker's user) could set a limit there (pids.max,
// cgroup.freeze, cgroup.max.descendants), make cgroups under it or hand
// its files to another user, and a later call must not inherit that.
//
// An inotify watch on each call's cgroup says what was changed: a write
// to any of its files other than processes moving in (cgroup.procs) and
// those the kernel
// marks modified as what they report changes (cgroup.events), a change of a file's owner
// or mode, a cgroup made, moved or removed in it or the cgroup itself
// moved: such a cgroup is removed after its call, never reused. Where the
// memory controller is enabled for calls, cgroups are not reused at all:
// memory.peak cannot be reset before Linux 6.12, so a later call would
// report an earlier call's peak, and memory.events would carry its kills.

// cgroupWatch watches the calls' cgroups for changes.
type cgroupWatch struct {
	fd int // inotify, non-blocking

	mu sync.Mutex
	// changed is, by watch descriptor, whether the cgroup was changed
	// since it was made; it holds only the cgroups not removed yet.
	changed map[int32]bool
}

// watchedEvents are the changes that make a cgroup unfit for reuse, and
// the write (IN_MODIFY) that may be the worker's own.
const watchedEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MOVE_SELF | unix.IN_DELETE_SELF

// ownWrites are the files of a call's cgroup written without changing
// it: by the worker moving a forked runner in, or by node code moving a
// process of its own into it. Not cgroup.kill: on this kernel (6.18), a
// process started straight into a cgroup that was ever killed through it
// is killed at birth (its kill count differs from the one the fork began
// with), so a cgroup whose leftovers were killed is removed, not reused.
var ownWrites = [][]byte{[]byte("cgroup.procs")}

// notified reports whether name is a file the kernel marks modified when
// what it reports changes (cgroup.events, pids.events, memory.events.local):
// read-only, so never a change made to the cgroup.
func notified(name []byte) bool {
	return bytes.HasSuffix(name, []byte(".events")) || bytes.HasSuffix(name, []byte(".events.local"))
}

// newCgroupWatch starts watching for changes, or returns nil where
// inotify is not available (cgroups are then not reused).
func newCgroupWatch() *cgroupWatch {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	return &cgroupWatch{fd: fd, changed: map[int32]bool{}}
}

// add watches a cgroup just made, before anything runs in it. It returns
// the watch, or -1 where it could not be added (the cgroup is then not
// reused).
func (w *cgroupWatch) add(dir string) int32 {
	if w == nil {
		return -1
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchedEvents)
	if err != nil {
		return -1
	}
	w.changed[int32(wd)] = false
	return int32(wd)
}

// drop forgets a cgroup being removed, and ends its watch: removing the
// cgroup does not (the kernel keeps the watch, and the cgroup's inode, for
// as long as the inotify instance lives).
func (w *cgroupWatch) drop(wd int32) {
	if w == nil || wd < 0 {
		return
	}
	w.mu.Lock()
	delete(w.changed, wd)
	unix.InotifyRmWatch(w.fd, uint32(wd)) // its IN_IGNORED is read as a cgroup gone
	w.mu.Unlock()
}

// unchanged reports whether nothing changed the cgroup of watch wd since
// it was made, as far as the events queued up to now say. Its processes
// must be gone: a write's event is queued by the time the write returns.
func (w *cgroupWatch) unchanged(wd int32) bool {
	if w == nil || wd < 0 {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readLocked()
	changed, ok := w.changed[wd]
	return ok && !changed
}

// readLocked takes the events queued and marks the cgroups they changed.
func (w *cgroupWatch) readLocked() {
	var buf [4096]byte
	for {
		n, err := unix.Read(w.fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return // EAGAIN: nothing more queued
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:end], "\x00")
			off = end
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				// Events were lost: any cgroup may have been changed.
				for wd := range w.changed {
					w.changed[wd] = true
				}
			case ev.Mask&unix.IN_IGNORED != 0:
				// The watch ended: its cgroup is gone.
			case ev.Mask == unix.IN_MODIFY && (isOwnWrite(name) || notified(name)):
			default:
				if _, ok := w.changed[ev.Wd]; ok {
					w.changed[ev.Wd] = true
				}
			}
		}
	}
}

func isOwnWrite(name []byte) bool {
	for _, own := range ownWrites {
		if bytes.Equal(name, own) {
			return true
		}
	}
	return false
}

// Reusable reports whether the cgroup may serve another call: calls'
// cgroups are reused here (no memory controller for them, inotify
// available), it is empty, not frozen, and nothing of its call changed
// it. The caller keeps it for a later call (Reuse), or removes it.
func (g *CallCgroup) Reusable() bool { return g.Unfit() == "" }

// Unfit says why the cgroup may not serve another call, or "" where it
// may (Reusable). A cgroup kept for a later call is asked again when it is
// handed out: node code of a call that runs meanwhile may have frozen it,
// changed it, or moved a process into it.
func (g *CallCgroup) Unfit() string {
	switch {
	case g.handedOn.Load():
		return "it was handed to another call"
	case g.watch < 0 || g.fd < 0 || g.events == nil || g.cpuStat == nil:
		return "it is not watched for changes"
	}
	return g.Unusable()
}

// Unusable says why the cgroup, made or kept for a runner not started
// yet, may not take it, or "" where it may: a process is in it, it is
// frozen, or it was changed (where it is watched).
func (g *CallCgroup) Unusable() string {
	var buf [128]byte
	events := g.read(g.events, "cgroup.events", buf[:])
	switch {
	case keyedValueOf(events, "populated") > 0:
		return "a process is in it"
	case keyedValueOf(events, "frozen") > 0:
		return "it is frozen (cgroup.freeze)"
	case g.watch >= 0 && !g.watcher.unchanged(g.watch):
		return "it was changed (a limit or cgroup.freeze written, a cgroup made in it, a file's owner or mode)"
	}
	return ""
}

// Reuse hands a cgroup Reusable said may serve another call on: it returns
// the cgroup for that call, whose CPU counts from now, and g stands for
// nothing from now on. What its last call's box still does with g (a
// spare's timer that kills what is left of it, firing late) cannot reach
// the next call.
func (g *CallCgroup) Reuse() *CallCgroup {
	next := &CallCgroup{dir: g.dir, fd: g.fd, cloneInto: g.cloneInto, role: g.role, memory: g.memory,
		watcher: g.watcher, watch: g.watch, events: g.events, cpuStat: g.cpuStat}
	next.cpuBase = next.cpuUsage()
	g.handedOn.Store(true)
	return next
}
