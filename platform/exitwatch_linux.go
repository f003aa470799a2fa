package platform

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExitWatch follows a process this worker did not fork and may not be the
// parent of: a runner a zygote forked, which is the zygote's child until
// the zygote dies and it is re-parented to this worker (a child
// subreaper). It holds a pidfd (Linux 5.3): unlike the pid, it names that
// one process even once the pid is reused.
type ExitWatch struct {
	pid    int
	pidfd  *os.File      // nil where pidfds are not available (an older kernel, a seccomp filter)
	exited chan struct{} // nil without a pidfd: it never closes
}

// WatchExit starts following pid, a process that has not been reaped yet.
func WatchExit(pid int) *ExitWatch {
	w := &ExitWatch{pid: pid}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return w
	}
	// Non-blocking: the runtime's poller waits for it, not a thread.
	w.pidfd = os.NewFile(uintptr(fd), "pidfd")
	rc, err := w.pidfd.SyscallConn()
	if err != nil {
		return w
	}
	w.exited = make(chan struct{})
	go func() {
		// A pidfd polls readable once its process has exited (a zombie
		// counts). Read waits on the poller until the check says so; it
		// fails once Close closes the pidfd, or where the poller cannot
		// take a pidfd: then Exited never closes.
		err := rc.Read(func(fd uintptr) bool {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return err == nil && n > 0
		})
		if err == nil {
			close(w.exited)
		}
	}()
	return w
}

// Exited closes once the process has exited, reaped or not; a nil channel
// where the kernel cannot say (no pidfd).
func (w *ExitWatch) Exited() <-chan struct{} { return w.exited }

// HasExited reports whether the process has exited (a zombie counts), as
// the kernel says now, and true once the watch was closed; false where the
// kernel cannot say (no pidfd, or no watch).
func (w *ExitWatch) HasExited() bool {
	if w == nil || w.pidfd == nil {
		return false
	}
	rc, err := w.pidfd.SyscallConn()
	if err != nil {
		return true
	}
	exited := false
	err = rc.Control(func(fd uintptr) {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		exited = err == nil && n > 0
	})
	return exited || err != nil
}

// WaitAdopted waits for the process as its parent, which this worker is
// once the process was re-parented to it, and says how it ended and what
// it cost. It fails with ECHILD where someone else reaped it (its former
// parent, before it died): then how it ended is lost.
func (w *ExitWatch) WaitAdopted() (syscall.WaitStatus, *syscall.Rusage, error) {
	if w.pidfd != nil {
		// Reaped already: its pid may be another process's by now.
		var err error
		if rc, rcErr := w.pidfd.SyscallConn(); rcErr == nil {
			rc.Control(func(fd uintptr) { err = unix.PidfdSendSignal(int(fd), 0, nil, 0) })
		}
		if errors.Is(err, unix.ESRCH) {
			return 0, nil, syscall.ECHILD
		}
	}
	var ws syscall.WaitStatus
	var ru syscall.Rusage
	for {
		_, err := syscall.Wait4(w.pid, &ws, 0, &ru)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return 0, nil, err
		}
		return ws, &ru, nil
	}
}

// Close stops following the process.
func (w *ExitWatch) Close() {
	if w.pidfd != nil {
		w.pidfd.Close()
	}
}
