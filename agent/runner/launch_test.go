//go:build linux

package runner

// A runner whose start fails leaves nothing behind, whichever of its three
// ways it started (launch.go): no call directory, no open descriptor. A
// worker whose starts fail again and again (an interpreter removed, a
// sandbox it cannot set up, a zygote that cannot fork) must not run out of
// descriptors or fill its state directory.
//
// These tests count this process's descriptors, so none of them runs in
// parallel: Go runs the parallel tests of a package only once the others
// are done.

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/platform"
)

// openFDs lists this process's open descriptors, each with what it is
// open on (a pipe's inode, a file's path), the listing's own aside.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	self := strconv.Itoa(int(d.Fd()))
	names, err := d.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	fds := map[string]string{}
	for _, n := range names {
		if target, err := os.Readlink("/proc/self/fd/" + n); err == nil && n != self {
			fds[n] = target
		}
	}
	return fds
}

// leftOpen says what is open in after that was not in before.
func leftOpen(before, after map[string]string) []string {
	var left []string
	for fd, target := range after {
		if before[fd] != target {
			left = append(left, fd+" → "+target)
		}
	}
	slices.Sort(left)
	return left
}

// nothingLeft fails the test where the pool's state directory holds a
// call directory, or a descriptor is open that was not before. The pool
// is closed first: what it keeps on purpose (boxes made ahead) goes.
func nothingLeft(t *testing.T, r *rig, before map[string]string) {
	t.Helper()
	r.pool.Close()
	if left := leftOpen(before, openFDs(t)); len(left) > 0 {
		t.Errorf("descriptors left open: %v", left)
	}
	entries, _ := os.ReadDir(filepath.Join(r.cfg.StateDir, callDirsName))
	for _, e := range entries {
		t.Errorf("a call directory was left: %s", e.Name())
	}
}

// Starting cold: every way it fails after the launch made something.
func TestAColdStartThatFailsLeavesNothingBehind(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		// The pipes, the call directory and the node's pipes are made.
		{"NoInterpreter", func(c *Config) { c.Python = "/nonexistent/python3" }, "starting /nonexistent/python3"},
		// The same, through the sandbox's setup program.
		{"NoSandboxProgram", func(c *Config) { c.Sandbox = &Sandbox{Exe: "/nonexistent/fluksio-worker"} }, "starting "},
		// The pipes are made, then no call directory can be.
		{"NoCallDirectory", func(c *Config) { c.StateDir = "/proc/self/no-such-state" }, "--state-dir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.change)
			before := openFDs(t)
			if _, err := r.start(context.Background(), "fails", nil); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start: %v; want it to fail with %q", err, c.want)
			}
			nothingLeft(t, r, before)
		})
	}
}

// Starting a spare ahead of its call: its start fails (and so does the
// call's, cold, that taught the pool its environment).
func TestASpareThatCannotStartLeavesNothingBehind(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*Config)
	}{
		// Its runtime answers which modes it speaks (the worker itself
		// runs it, outside any sandbox); the spare's sandbox cannot be set up.
		{"NoSandboxProgram", func(c *Config) { c.Sandbox = &Sandbox{Exe: "/nonexistent/fluksio-worker"} }},
		// Its pipes are made, then no call directory can be.
		{"NoCallDirectory", func(c *Config) { c.StateDir = "/proc/self/no-such-state" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, func(cfg *Config) {
				cfg.Spares = 1
				c.change(cfg)
			})
			before := openFDs(t)
			if _, err := r.start(context.Background(), "teaches", nil); err == nil {
				t.Fatal("Start: the call started; want it to fail as its spare does")
			}
			nothingLeft(t, r, before) // Close waits for the spare's start
			if !strings.Contains(r.log.String(), "could not start a spare runner") {
				t.Fatalf("no spare was started; the log:\n%s", r.log.String())
			}
		})
	}
}

// Forking from a zygote: the zygote answers that it could not fork
// (worker_main.py's FORK_FAILED). The test is the zygote, on the other end
// of the real control socket: the runtime's zygote forks only in a process
// that contains calls in cgroups (TestZygotes), where descriptors cannot
// be counted, as its tests run in parallel.
func TestAForkThatFailsLeavesNothingBehind(t *testing.T) {
	r := newRig(t, nil)
	z, zygoteSide := fakeZygote(t, r)
	s := z.spareToFork(r)
	before := openFDs(t)
	handed := make(chan int, 1)
	done := refuseForks(zygoteSide, handed)
	defer func() {
		z.closeControl()
		<-done
		zygoteSide.Close()
	}()
	err := z.fork(s, false)
	if n := <-handed; n != forkFDs {
		t.Errorf("the zygote was handed %d descriptors; want %d", n, forkFDs)
	}
	if err == nil || !strings.Contains(err.Error(), "could not fork") {
		t.Fatalf("fork: %v; want the zygote's refusal", err)
	}
	nothingLeft(t, r, before)
}

// fakeZygote is a zygote whose end of the real control socket is the
// test's (zygoteSide): no process behind it.
func fakeZygote(t *testing.T, r *rig) (z *zygote, zygoteSide *net.UnixConn) {
	t.Helper()
	worker, zygoteEnd, err := controlPair()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.FileConn(zygoteEnd)
	zygoteEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	p := &warmPool{cfg: &r.pool.cfg, forkTimeout: waitLong}
	we := &warmEnv{rt: Runtime{Path: r.runtime, Embedded: true}}
	return &zygote{spare: &spare{pool: p, we: we, box: &box{log: r.cfg.Log}}, ctl: worker}, c.(*net.UnixConn)
}

// spareToFork is a spare for z to fork, as a call that found none ready
// asks for one.
func (z *zygote) spareToFork(r *rig) *spare {
	return &spare{pool: z.pool, we: z.we, exited: make(chan struct{}), state: spareServing, box: &box{log: r.cfg.Log, kept: z.pool.cfg.cgroups}}
}

// refuseForks plays the zygote on zygoteSide until the worker's end is
// closed (done): it takes each fork request and the runner's descriptors,
// closes them, says on handed how many it was handed, and answers that it
// could not fork (worker_main.py's FORK_FAILED).
func refuseForks(zygoteSide *net.UnixConn, handed chan<- int) (done <-chan struct{}) {
	served := make(chan struct{})
	go func() {
		defer close(served)
		buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(8*forkFDs))
		for {
			_, oobn, _, _, err := zygoteSide.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			n := 0
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					unix.Close(fd)
					n++
				}
			}
			handed <- n
			zygoteSide.Write([]byte("0"))
		}
	}()
	return served
}

// limitFDs lets this process open only free descriptors more, until
// restore: every way of starting a runner then fails at the point where it
// makes its free+1st. The limit is set with the system call itself:
// syscall.Setrlimit would stop os/exec from giving the runners the limit
// the process started with, for the rest of the tests.
func limitFDs(t *testing.T, free int) (restore func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	open := openFDs(t)
	// The lowest limit with free unused descriptors below it.
	limit := 0
	for n := 0; n < free; limit++ {
		if _, used := open[strconv.Itoa(limit)]; !used {
			n++
		}
	}
	prlimit := func(l *unix.Rlimit) {
		if _, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_NOFILE, uintptr(unsafe.Pointer(l)), 0, 0, 0); e != 0 {
			t.Fatalf("setting RLIMIT_NOFILE: %v", e)
		}
	}
	prlimit(&unix.Rlimit{Cur: uint64(limit), Max: old.Max})
	return func() { prlimit(&old) }
}

// outOfDescriptors runs start with no descriptor free, then one, and so
// on until it starts: each start that failed must have left nothing
// behind. started ends what start started.
//
// It starts once first with no limit: what the process opens once for all
// its runners (the worker's memory cgroup's OOM counter, say) is open
// then, and is not taken for what a start left; nor is it tried first out
// of descriptors, which would leave the process without it.
func outOfDescriptors(t *testing.T, r *rig, start func() error, started func()) {
	t.Helper()
	if err := start(); err != nil {
		t.Fatalf("it does not start even with descriptors free: %v", err)
	}
	started()
	before := openFDs(t)
	failed := 0
	for free := 0; ; free++ {
		if free > 100 {
			t.Fatalf("it did not start with %d descriptors free", free)
		}
		restore := limitFDs(t, free)
		err := start()
		restore()
		if err == nil {
			break
		}
		failed++
		t.Logf("with %d descriptors free: %v", free, err)
		if left := leftOpen(before, openFDs(t)); len(left) > 0 {
			t.Fatalf("with %d descriptors free, a start that failed (%v) left open %v", free, err, left)
		}
		if dirs := r.callDirs(); len(dirs) > 0 {
			t.Fatalf("with %d descriptors free, a start that failed (%v) left the call directories %v", free, err, dirs)
		}
	}
	started()
	if failed < 6 {
		t.Errorf("it started with %d descriptors free; want the pipes of a start to need more", failed)
	}
	nothingLeft(t, r, before)
}

// Out of descriptors, a start fails wherever it next makes one (a pipe, a
// directory's listing, the process itself): whichever it was, it leaves
// nothing behind.
func TestAStartOutOfDescriptorsLeavesNothingBehind(t *testing.T) {
	t.Run("Cold", func(t *testing.T) {
		r := newRig(t, nil)
		var c *call
		outOfDescriptors(t, r, func() (err error) {
			c, err = r.start(context.Background(), "cold", nil)
			return err
		}, func() {
			answer(t, c.output(t))
			c.end(t, true)
		})
	})
	for name, role := range map[string]platform.CgroupRole{"Spare": platform.CgroupSpare, "Zygote": platform.CgroupZygote} {
		t.Run(name, func(t *testing.T) {
			// The fake runner knows no zygote mode: started as one, it
			// waits for a request like any runner, and is discarded.
			r := newRig(t, func(c *Config) { c.Spares = 1 })
			p := r.pool.warm
			we := &warmEnv{rt: Runtime{Path: r.runtime, Embedded: true}}
			var s *spare
			var report *os.File
			var closeControl func() // a zygote's
			outOfDescriptors(t, r, func() (err error) {
				s = &spare{pool: p, we: we, started: make(chan struct{}), exited: make(chan struct{})}
				s.box = &box{log: r.cfg.Log, kept: p.cfg.cgroups, role: role}
				if role == platform.CgroupZygote {
					z := &zygote{spare: s}
					report, err = z.start()
					closeControl = z.closeControl
					return err
				}
				report, err = s.start()
				return err
			}, func() {
				if closeControl != nil {
					closeControl()
				}
				report.Close()
				go func() {
					s.exitErr = s.cmd.Wait()
					s.box.reaped(s.cmd)
					close(s.exited)
				}()
				p.discard(s)
			})
		})
	}
	t.Run("Fork", func(t *testing.T) {
		r := newRig(t, nil)
		z, zygoteSide := fakeZygote(t, r)
		// The zygote's side, as in TestAForkThatFailsLeavesNothingBehind,
		// for every fork request: it refuses each.
		asked := make(chan int, 1)
		served := refuseForks(zygoteSide, asked)
		defer func() {
			z.closeControl()
			<-served
			zygoteSide.Close()
		}()
		// It "starts" once its request reached the zygote: the refusal
		// after is TestAForkThatFailsLeavesNothingBehind's.
		outOfDescriptors(t, r, func() error {
			err := z.fork(z.spareToFork(r), false)
			select {
			case <-asked:
				return nil
			default:
				return err
			}
		}, func() {})
	})
}

// A real zygote, stopped (SIGSTOP): the fork of a spare ahead waits for its
// answer until forkTimeout, fails, and the zygote is replaced. What that
// fork made (the runner's pipes, its call directory, the node's pipes, its
// cgroup) is gone with it. It runs in a child test process that contains
// calls in cgroups, alone there, so its descriptors can be counted.
func TestAStoppedZygotesForkLeavesNothingBehind(t *testing.T) {
	if !inContainedChild(t) {
		return
	}
	z := newZygoteRig(t, 1, nil)
	z.pool.warm.forkTimeout = 200 * time.Millisecond
	_, spares := z.stoppedZygote(t)
	// Counted now: what the pool holds (the zygote, its spares) goes with
	// it; what the failed fork made must too.
	before := openFDs(t)
	c := z.runForked(t, "takes-a-spare", pidNode, spares)
	answer(t, c.output(t))
	deadline := time.Now().Add(waitLong)
	for !strings.Contains(z.log.String(), "a zygote could not fork a spare; replacing it") {
		if time.Now().After(deadline) {
			t.Fatalf("no fork failed on the stopped zygote within %s", waitLong)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.end(t, true)
	nothingLeft(t, z.rig, before)
}
