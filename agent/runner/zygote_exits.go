package runner

// A zygote's runners are its children: it reaps each one and reports how
// it ended to the worker on a pipe (worker_main.py's ExitReports), in
// records of 16 bytes, each written at once (a pipe never splits a write
// under PIPE_BUF), in the machine's byte order: the runner's pid and its
// raw wait status (32 bits each), and its peak resident memory in KiB (64
// bits; where the call's cgroup has no memory controller, a cgroup v1
// host, this is all the worker learns of it). One goroutine per zygote
// reads them and hands each to the waiter of its pid.
//
// A zygote that dies (killed, or discarded while its runners still run
// calls: a stale one is replaced at once) leaves its runners to the
// worker: the kernel re-parents them to it, a child subreaper, and the
// worker waits for them itself, for their real status. The kernel closes
// a dying process's files before it re-parents its children, so the
// pipe's end says only that no report will come: a runner still waiting
// is waited for once the zygote itself has been reaped. One the zygote
// reaped but did not report (it died in between) has lost its status,
// and its death message says so.
//
// A zygote that lives but does not reap (stopped, wedged) would hold its
// runners' ends back: the kernel says when a runner exited (a pidfd), and
// a zygote that has not reported it within exitReportWait is replaced,
// which leaves its runners to the worker.

import (
	"encoding/binary"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// exitReportWait is how long a runner's exit may go unreported once the
// kernel says it exited. A zygote wakes for it at once (SIGCHLD), and
// reports in a millisecond, tens on a loaded machine; one that has not by
// then does not serve (stopped, or wedged), and is replaced. Half of
// reapWait, which a death message waits for the runner's status: time is
// left to replace the zygote and wait for the runner.
const exitReportWait = reapWait / 2

// runnerExits is what a zygote reported of its runners' exits.
type runnerExits struct {
	done chan struct{} // closed at the pipe's end: no report comes any more

	mu      sync.Mutex
	waiting map[int]chan *runnerExit // runners forked, not reported yet
	early   map[int]*runnerExit      // reports of runners not registered yet
}

// newRunnerExits reads the zygote's reports from r until its end.
func newRunnerExits(r *os.File) *runnerExits {
	x := &runnerExits{
		done:    make(chan struct{}),
		waiting: map[int]chan *runnerExit{},
		early:   map[int]*runnerExit{},
	}
	go x.read(r)
	return x
}

func (x *runnerExits) read(r *os.File) {
	defer close(x.done)
	defer r.Close()
	buf := make([]byte, 64*exitRecordSize)
	have := 0
	for {
		n, err := r.Read(buf[have:])
		have += n
		whole := have - have%exitRecordSize
		for off := 0; off < whole; off += exitRecordSize {
			rec := buf[off : off+exitRecordSize]
			pid := int(int32(binary.NativeEndian.Uint32(rec)))
			x.deliver(pid, &runnerExit{
				status:  syscall.WaitStatus(binary.NativeEndian.Uint32(rec[4:])),
				peakRSS: platform.MaxRSSBytes(int64(binary.NativeEndian.Uint64(rec[8:]))),
			})
		}
		have = copy(buf, buf[whole:have])
		if err != nil {
			return
		}
	}
}

// deliver hands a report to its runner's waiter, or keeps it for the
// runner's registration: the zygote answers a fork with the pid on
// another channel, and the runner may exit, and be reported, first.
func (x *runnerExits) deliver(pid int, e *runnerExit) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if ch, ok := x.waiting[pid]; ok {
		delete(x.waiting, pid)
		ch <- e
		return
	}
	// Every pid the zygote reports is one it answered a fork with: only a
	// fork the worker gave up on leaves one here for good, and the worker
	// then replaces the zygote, so it never meets a later runner that
	// reuses the pid.
	x.early[pid] = e
}

// expect registers pid, a runner the zygote answered a fork with: its
// report comes on the channel, at once if it came already.
func (x *runnerExits) expect(pid int) <-chan *runnerExit {
	ch := make(chan *runnerExit, 1)
	x.mu.Lock()
	defer x.mu.Unlock()
	if e, ok := x.early[pid]; ok {
		delete(x.early, pid)
		ch <- e
		return ch
	}
	x.waiting[pid] = ch
	return ch
}

// waitRunner waits for the end of pid, a runner the zygote z forked, and
// says how it ended: as z reported it, or, once z is gone, as the worker
// finds it when it waits for the runner itself.
func (z *zygote) waitRunner(pid int, report <-chan *runnerExit, watch *platform.ExitWatch) *runnerExit {
	x := z.exits
	exited := watch.Exited()
	var late <-chan time.Time
	for {
		select {
		case e := <-report:
			return e
		case <-exited:
			exited = nil
			t := time.NewTimer(z.pool.exitReportWait)
			defer t.Stop()
			late = t.C
		case <-late:
			late = nil
			z.box.log.Info("a zygote did not report a runner's exit; replacing it", "pid", pid, "waited", z.pool.exitReportWait.String())
			p := z.pool
			p.mu.Lock()
			p.dropLocked(z.spare)
			p.fillLocked()
			p.mu.Unlock()
		case <-x.done:
			select {
			case e := <-report: // reported before the end
				return e
			default:
			}
			<-z.exited // reaped, so its children are the worker's now
			ws, ru, err := watch.WaitAdopted()
			if err != nil {
				z.box.log.Info("a forked runner's exit status is lost: its zygote reaped it and died before it reported it", "pid", pid, "error", err)
				return &runnerExit{lost: true}
			}
			return exitOfRusage(ws, ru)
		}
	}
}
