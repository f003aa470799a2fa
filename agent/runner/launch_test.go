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

	"golang.org/x/sys/unix"
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
	worker, zygoteEnd, err := controlPair()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.FileConn(zygoteEnd)
	zygoteEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	zygoteSide := c.(*net.UnixConn)
	defer zygoteSide.Close()
	p := &warmPool{cfg: &r.pool.cfg, forkTimeout: waitLong}
	we := &warmEnv{rt: Runtime{Path: r.runtime, Embedded: true}}
	z := &zygote{spare: &spare{pool: p, we: we, box: &box{log: r.cfg.Log}}, ctl: worker}
	defer z.closeControl()
	s := &spare{pool: p, we: we, exited: make(chan struct{}), state: spareServing, box: &box{log: r.cfg.Log, kept: p.cfg.cgroups}}

	before := openFDs(t)
	received := make(chan int, 1)
	go func() {
		// The zygote's side: it takes the request and the runner's
		// descriptors, closes them, and answers that it could not fork.
		buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(8*forkFDs))
		_, oobn, _, _, err := zygoteSide.ReadMsgUnix(buf, oob)
		n := 0
		if err == nil {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					unix.Close(fd)
					n++
				}
			}
		}
		zygoteSide.Write([]byte("0"))
		received <- n
	}()
	err = z.fork(s, false)
	if n := <-received; n != forkFDs {
		t.Errorf("the zygote was handed %d descriptors; want %d", n, forkFDs)
	}
	if err == nil || !strings.Contains(err.Error(), "could not fork") {
		t.Fatalf("fork: %v; want the zygote's refusal", err)
	}
	nothingLeft(t, r, before)
}
