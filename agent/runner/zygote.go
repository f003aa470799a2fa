package runner

// Zygotes: where each call has a cgroup of its own and the worker adopts
// orphans (a child subreaper), an environment's warm runner is not a spare
// that serves one call but a zygote, an interpreter that loaded the runtime
// and the preloads once and forks each call's runner (worker_main.py's
// zygote mode). A fork costs a millisecond or two where a spare costs an
// interpreter start, so calls that come back to back are warm too, and the
// forks share the zygote's pages copy-on-write.
//
// The forked runner is the zygote's child (one fork, the cheapest): the
// zygote reaps it and reports how it ended to the worker on a pipe
// (zygote_exits.go), and its call's cgroup says what it cost, so its
// figures are the call's, not the zygote's start-up. Should the zygote die
// first, its runners are re-parented to the worker (a child subreaper),
// which waits for them itself. A runner gets the call's descriptors over
// the control socket, its environment and working directory, a process
// group of its own, and is moved into its call's cgroup before the worker
// writes its request, so no node code runs outside it. Where there is no
// cgroup, spares are used: a forked runner shows its zygote's environment
// in /proc, so the cookie would not find what node code forks without an
// exec.
//
// A zygote is watched like a spare: a stale one (code it loaded changed),
// one too old, one that died or does not answer a fork is replaced, and
// the calls meanwhile start cold.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/platform"
)

// forkTimeout bounds one fork of a spare ahead of its call: a zygote that
// does not answer in this time is wedged; it is replaced. Calls do not wait
// for it meanwhile (callForkTimeout).
const forkTimeout = 5 * time.Second

// callForkTimeout bounds a fork a call waits for (no spare was ready): a
// fork takes a millisecond or two on an idle machine and tens on a loaded
// one, a cold start tens to hundreds, so a zygote that has not answered by
// then is taken for wedged: it is replaced and the call starts cold.
const callForkTimeout = 250 * time.Millisecond

// errZygoteBusy: the zygote is forking a spare; a call does not queue
// behind it (a wedged zygote would hold it for forkTimeout), it starts cold.
var errZygoteBusy = errors.New("the zygote is busy forking a spare")

// forksHere reports whether calls of a worker with the sandbox sb (nil:
// none) can be forked from zygotes: a cgroup per call, and orphans
// adopted by this process. In a sandbox, only where forks can sandbox
// themselves (sandbox.go).
func forksHere(sb *Sandbox) bool {
	return callCgroupsSet() != nil && isSubreaper() && (sb == nil || sb.forks)
}

var isSubreaper = sync.OnceValue(platform.IsSubreaper)

// zygote is an environment's zygote: a warm process watched for
// freshness and discarded as a spare is (its spare), which forks the
// environment's spares and serves no call itself. Beyond the spare it has
// its control socket, and its runners' exits as it reports them.
type zygote struct {
	*spare
	mu    sync.Mutex // one fork at a time; held while it is discarded
	ctl   *net.UnixConn
	exits *runnerExits
}

// run starts the zygote, waits for its report, and then for its end:
// ready, it forks its environment's spares; replaced or dead, it serves
// no fork after.
func (z *zygote) run() {
	p := z.pool
	report, err := z.start()
	if err != nil {
		z.startFailed(err)
		return
	}
	r, err := z.awaitReport(report)
	if r.Threads != nil || r.NoForks != "" {
		// A fork keeps only the thread that forks: the library whose
		// threads are gone hangs or aborts in every call. The zygote
		// forks none (it answers 0); its environment's spares start cold.
		p.mu.Lock()
		if z.state == spareStarting {
			if !p.threaded[z.we.key] {
				p.threaded[z.we.key] = true
				if r.Threads != nil {
					z.box.log.Warn("a --preload module started threads, and a process with threads cannot be forked safely; spares of its environment start cold instead of forked from a zygote", "module", r.Threads.Module, "threads", r.Threads.Count)
				} else {
					z.box.log.Warn("runners forked from a zygote cannot sandbox themselves here; spares of its environment start cold, each in a sandbox of its own", "why", r.NoForks)
				}
			}
			p.dropLocked(z.spare)
			p.fillLocked()
		}
		p.mu.Unlock()
	}
	if z.settle(r, err) {
		p.mu.Lock()
		p.fillLocked() // its spares are forked now
		p.mu.Unlock()
	}
	z.waitServed()
	// Once it is gone: a fork in flight holds the zygote's lock until it
	// is answered, and a wedged zygote answers only by its end.
	z.closeControl()
}

// start starts the zygote's process with the descriptors it reports on,
// is asked to fork on and reports its runners' exits on; it returns the
// report's read end.
func (z *zygote) start() (*os.File, error) {
	p := z.pool
	l := newLaunch(p.cfg, z.box.log)
	defer l.close() // all of it, where it did not start
	// Its own output goes nowhere: no call reads it.
	if err := l.stdio(false); err != nil {
		return nil, err
	}
	reportR, reportW, err := l.fromRunner()
	if err != nil {
		return nil, err
	}
	exitsR, exitsW, err := l.fromRunner()
	if err != nil {
		return nil, err
	}
	ctl, ctlChild, err := controlPair()
	if err != nil {
		return nil, err
	}
	l.track(ctl, ctlChild)
	args := []string{p.cfg.script(z.we.rt), zygoteFlag, strconv.Itoa(zygoteReportFD), strconv.Itoa(zygoteControlFD), strconv.Itoa(zygoteExitsFD)}
	if p.preload != "" {
		args = append(args, p.preload)
	}
	extra := extraFiles(map[int]*os.File{zygoteReportFD: reportW, zygoteControlFD: ctlChild, zygoteExitsFD: exitsW})
	if err := z.launch(l, args, extra); err != nil {
		return nil, err
	}
	z.ctl = ctl
	z.exits = newRunnerExits(exitsR)
	l.handOver()
	close(z.started)
	return reportR, nil
}

// controlPair makes the zygote's control socket: the worker's end and the
// zygote's, which the zygote inherits.
func controlPair() (*net.UnixConn, *os.File, error) {
	// Close-on-exec before any other runner can start with it (the way
	// os.Pipe does where pipe2 is missing): only the zygote gets its end.
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("creating the zygote's control socket: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "zygote-control")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("creating the zygote's control socket: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "zygote-control"), nil
}

// fork makes s, a spare of z's environment, by forking it from the
// zygote z: running, in its own box, waiting for its request (its caller
// closes s.started, for a spare ahead once it is ready). forCall is
// a fork a call waits for: it does not wait for a fork in flight
// (errZygoteBusy), and gives the zygote callForkTimeout to answer.
//
// The zygote serves one fork at a time, up to its answer (the runner's
// pid); taking the runner in (its move into the call's cgroup, which
// waits for the kernel's RCU: 10 ms and more on a loaded machine) is the
// worker's alone, and goes on while the zygote forks the next spare.
func (z *zygote) fork(s *spare, forCall bool) error {
	p := z.pool
	timeout := p.forkTimeout
	if forCall {
		timeout = callForkTimeout
		if !z.mu.TryLock() {
			return errZygoteBusy
		}
	} else {
		z.mu.Lock()
	}
	serving := true
	served := func() { // the zygote is free for the next fork
		if serving {
			serving = false
			z.mu.Unlock()
		}
	}
	defer served()
	if z.ctl == nil {
		return errors.New("the zygote was stopped")
	}
	l := newLaunch(p.cfg, s.box.log)
	defer l.close() // all of it, where it was not taken in
	if err := l.stdio(true); err != nil {
		return err
	}
	if err := l.makeDir(); err != nil {
		return err
	}
	if err := l.makeNodePipes(); err != nil {
		return err
	}
	env := s.box.make(l.dir.env(effectiveEnv(p.cfg.env(z.we.env)), p.cfg.CancelGrace))
	if sb := p.cfg.Sandbox; sb != nil {
		env = p.cfg.sandboxEnv(env, l.dir, sb)
	}
	fail := func(err error) error {
		if s.box.cg != nil {
			s.box.cg.Remove(0)
		}
		return err
	}
	msg, err := json.Marshal(forkRequest{Env: env, Cwd: l.dir.cwd, Token: l.nodes.token})
	if err != nil {
		return fail(err)
	}
	// The runner's ends (forkFDs), at the descriptors it gets them at:
	// its stdin, stdout and stderr, the node's output pipes.
	child := make([]*os.File, forkFDs)
	copy(child, l.runner[:])
	child[forkedOutputFD], child[forkedOutputFD+1] = l.nodes.w[0], l.nodes.w[1]
	fds := make([]int, len(child))
	for i, f := range child {
		fds[i] = int(f.Fd())
	}
	pid, err := platform.Adopt(func() (int, error) {
		ctl := z.ctl
		ctl.SetDeadline(time.Now().Add(timeout))
		if _, _, err := ctl.WriteMsgUnix(msg, unix.UnixRights(fds...), nil); err != nil {
			return 0, fmt.Errorf("asking the zygote to fork: %w", err)
		}
		var buf [forkAnswerMax]byte
		n, err := ctl.Read(buf[:])
		if err != nil {
			return 0, fmt.Errorf("reading the zygote's answer: %w", err)
		}
		pid, err := strconv.Atoi(string(buf[:n]))
		if err != nil || pid <= 0 {
			return 0, fmt.Errorf("the zygote could not fork (it answered %q)", buf[:n])
		}
		return pid, nil
	})
	served()
	if err != nil {
		return fail(err)
	}
	l.started()
	// Its report may have come already: a runner can exit before this.
	report := z.exits.expect(pid)
	watch := platform.WatchExit(pid)
	s.forked = watch
	s.box.pid = pid
	if s.box.cg != nil {
		// Before the request is written: the runner waits for it, so no
		// node code runs outside the call's cgroup.
		err := s.box.cg.Move(pid)
		if err == nil && s.box.cg.Frozen() {
			// It would wait, frozen, for its call.
			err = errors.New("the call's cgroup is frozen (cgroup.freeze; node code of another call can write it)")
		}
		if err != nil {
			// Nothing of a call ran in it yet: it goes, and the call starts cold.
			platform.SignalGroup(pid, syscall.SIGKILL)
			z.waitRunner(pid, report, watch)
			watch.Close()
			platform.Forget(pid)
			l.close()
			s.box.cg.Remove(reapWait)
			return fmt.Errorf("taking the forked runner in: %w", err)
		}
	}
	s.stdin, s.stdout, s.stderr, s.dir, s.pipes = l.stdin, l.stdout, l.stderr, l.dir, l.nodes
	l.handOver()
	// In its call's cgroup now; without one, in the zygote's.
	if g := s.box.cg; g != nil {
		s.box.oom = platform.WatchOOM(g)
	} else {
		s.box.oom = platform.WatchOOM(z.box.cg)
	}
	go func() {
		e := z.waitRunner(pid, report, watch)
		watch.Close()
		s.box.setExit(e)
		s.exitErr = e.err()
		platform.Forget(pid)
		close(s.exited)
	}()
	return nil
}

// closeControl ends the zygote's service: it exits once it reads the end.
func (z *zygote) closeControl() {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.ctl != nil {
		z.ctl.Close()
		z.ctl = nil
	}
}
