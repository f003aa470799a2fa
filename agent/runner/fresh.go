package runner

// Freshness of warm runners: a spare or a zygote is not handed a call once
// a file or directory its code came from changed after it started (the
// runtime's report names them: the interpreter, each sys.path entry, each
// loaded module's file and directory). Where the kernel offers change
// notifications (Linux's inotify, fresh_linux.go), the worker follows
// those paths as the warm runner gets ready, and a call's check is one
// read of what changed meanwhile, not a stat of every path (about 150 with
// the runtime alone, 0.26 ms of every warm call's path). A path that
// notifications cannot follow (see fresh_linux.go) is checked by its
// status, as everywhere without notifications: its change time is read at
// each check.

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// reportedPath is a file or directory a warm runner's code came from, and
// whether it existed when the runner reported.
type reportedPath struct {
	path    string
	existed bool
}

// watchedPath is a reported path, its change time and identity (device
// and inode) once the runner was ready, and whether notifications follow
// it. The identity tells a path that now leads to another file (a link
// pointed elsewhere, a file replaced by a rename) even where both files'
// change times are the same clock tick.
type watchedPath struct {
	reportedPath
	change   unix.Timespec
	dev, ino uint64
	followed bool
}

// codeWatch is what a warm runner's code came from and whether it changed
// since the runner started. A zygote's is shared with the spares it forks
// (their code is its code).
type codeWatch struct {
	began time.Time
	paths []watchedPath
	stale atomic.Pointer[string]
	// Guarded by the changeWatcher's mutex.
	refs      int
	interests []interest
}

// markStale records why cw's runner must serve no call; the first reason
// stays.
func (cw *codeWatch) markStale(why string) {
	cw.stale.CompareAndSwap(nil, &why)
}

// follow makes the codeWatch of a runner started at began whose code came
// from paths: followed by w's notifications where it can, else by status.
// Every path is checked once after its notification is in place, so a
// change between the runner's start and then is not missed either.
func (w *changeWatcher) follow(paths []reportedPath, began time.Time) *codeWatch {
	cw := &codeWatch{began: began, refs: 1}
	unfollowed := paths
	if w != nil {
		unfollowed = w.add(cw, paths)
	}
	polled := make(map[string]bool, len(unfollowed))
	for _, rp := range unfollowed {
		polled[rp.path] = true
	}
	cw.paths = make([]watchedPath, 0, len(paths))
	since := unix.NsecToTimespec(began.Add(-changeSlack).UnixNano())
	for _, rp := range paths {
		var st unix.Stat_t
		err := unix.Stat(rp.path, &st)
		switch {
		case (err == nil) != rp.existed:
			cw.markStale("appeared or disappeared: " + rp.path)
		case err == nil && timespecAfter(st.Ctim, since):
			cw.markStale("changed since it started: " + rp.path)
		}
		wp := watchedPath{reportedPath: rp, followed: !polled[rp.path]}
		if err == nil {
			wp.change, wp.dev, wp.ino = st.Ctim, uint64(st.Dev), st.Ino
		}
		cw.paths = append(cw.paths, wp)
	}
	return cw
}

// staleness says why cw's runner must not serve a call, or "": what the
// notifications said so far, and the status of the paths they do not
// follow (of every path, where what they said cannot be read now).
func (cw *codeWatch) staleness(w *changeWatcher) string {
	synced := w.sync()
	if why := cw.stale.Load(); why != nil {
		return *why
	}
	since := unix.NsecToTimespec(cw.began.Add(-changeSlack).UnixNano())
	for _, wp := range cw.paths {
		if synced && wp.followed {
			continue
		}
		var st unix.Stat_t
		err := unix.Stat(wp.path, &st)
		switch {
		case (err == nil) != wp.existed:
			return "appeared or disappeared: " + wp.path
		case err != nil:
		case st.Ctim != wp.change || timespecAfter(st.Ctim, since):
			return "changed since it started: " + wp.path
		case uint64(st.Dev) != wp.dev || st.Ino != wp.ino:
			return "now another file: " + wp.path
		}
	}
	return ""
}

func timespecAfter(a, b unix.Timespec) bool {
	return a.Sec > b.Sec || (a.Sec == b.Sec && a.Nsec > b.Nsec)
}

// changeSlack covers the file system's clock: a file's change time comes
// from the kernel's coarse clock, which may be up to a tick (at most 10 ms)
// behind the time the worker read when it started the spare. A change that
// close to a spare's start marks it stale, at worst one cold start more.
const changeSlack = 20 * time.Millisecond

// spareMaxAge retires a spare that waited this long, and starts another:
// what the freshness check cannot see (a changed file the interpreter read
// at start outside sys.path, a system clock step) is never older than this.
const spareMaxAge = 10 * time.Minute

// spareCheckInterval is how often waiting spares are checked for age,
// freshness and death, so a stale spare is replaced before a call finds it.
const spareCheckInterval = 5 * time.Second

// staleness says why s must not serve a call, or "".
func (s *spare) staleness() string {
	if time.Since(s.began) > spareMaxAge {
		return "older than its maximum age"
	}
	if s.code == nil {
		return ""
	}
	return s.code.staleness(s.pool.changes)
}

// releaseCodeLocked stops following s's code, once. The pool's mutex is
// held.
func (s *spare) releaseCodeLocked() {
	if s.code != nil && !s.released {
		s.released = true
		s.pool.changes.release(s.code)
	}
}

// watch retires spares that are too old, stale or dead, and replaces them.
func (p *warmPool) watch() {
	tick := time.NewTicker(spareCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.janitor:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		var ready []*spare
		for _, we := range p.envs {
			for _, s := range we.ownLocked() {
				if s.state == spareReady {
					ready = append(ready, s)
				}
			}
		}
		p.mu.Unlock()
		var gone []*spare
		for _, s := range ready {
			if why := s.staleness(); why != "" {
				s.box.log.Debug("spare runner retired", "reason", why)
				gone = append(gone, s)
			}
		}
		if len(gone) == 0 {
			continue
		}
		p.mu.Lock()
		for _, s := range gone {
			p.dropLocked(s)
		}
		p.fillLocked()
		p.publishLocked()
		p.mu.Unlock()
	}
}
