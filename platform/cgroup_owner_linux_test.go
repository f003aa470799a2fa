package platform

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv makes this test binary one of the processes a test starts
// (TestCgroupHelperProcess): "worker" sets up cgroups as a worker does and
// keeps a call running; "nest" starts a "worker" as its child, so that
// the worker is not pid 1 of its PID namespace, nor a low one;
// "root-nest" does the same with a worker in a cgroup namespace whose
// root is the nest's cgroup, which sees it as the root cgroup (as in a
// container); "signal" signals what is in a cgroup. Each first waits for
// a line on stdin: the test moves it where it should be meanwhile.
const helperEnv = "FLUKSIO_TEST_CGROUP_HELPER"

func TestCgroupHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	if mode != "worker-go" && mode != "root-worker" {
		if _, err := readLine(os.Stdin); err != nil {
			fmt.Println("no go line:", err)
			os.Exit(2)
		}
	}
	switch mode {
	case "worker", "worker-go":
		helperWorker()
	case "root-worker":
		// Its own cgroup hierarchy, whose root is its cgroup namespace's,
		// mounted where the host's is, in its own mount namespace.
		mount, err := unifiedMount()
		if err == nil {
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		}
		if err == nil { // the same hierarchy cannot be mounted on itself
			err = unix.Unmount(mount, unix.MNT_DETACH)
		}
		if err == nil {
			err = unix.Mount("cgroup2", mount, "cgroup2", 0, "")
		}
		if err != nil {
			fmt.Println("mounting the cgroup hierarchy:", err)
			os.Exit(2)
		}
		helperWorker()
	case "nest", "root-nest":
		// Pids taken first, so that the worker's is none that a thread of
		// another new namespace's first process may have.
		for range 64 {
			exec.Command("true").Run()
		}
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), helperEnv+"=worker-go")
		if mode == "root-nest" {
			cmd.Env = append(os.Environ(), helperEnv+"=root-worker")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWCGROUP}
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("nested worker:", err)
			os.Exit(2)
		}
	case "signal":
		g := &CallCgroup{dir: os.Getenv("CGROUP"), fd: -1}
		fmt.Printf("found=%v\n", g.Signal(syscall.SIGKILL, 0))
	}
	os.Exit(0)
}

// readLine reads one line, a byte at a time: what follows is another's.
func readLine(r io.Reader) (string, error) {
	var line []byte
	var b [1]byte
	for {
		if _, err := r.Read(b[:]); err != nil {
			return string(line), err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
}

// helperWorker sets up cgroups as a worker starting does, starts a call
// (sleep) in a call's cgroup, says where ("base DIR call DIR pid N"), and
// keeps it running until stdin ends.
func helperWorker() {
	cc, err := SetupCgroups()
	if err != nil {
		fmt.Println("setup:", err)
		os.Exit(2)
	}
	g, err := cc.New("helper")
	if err != nil {
		fmt.Println("new:", err)
		os.Exit(2)
	}
	cmd := exec.Command("sleep", "1000")
	g.Prepare(cmd)
	if err := cmd.Start(); err != nil {
		fmt.Println("start:", err)
		os.Exit(2)
	}
	if err := g.Started(cmd.Process.Pid); err != nil {
		fmt.Println("started:", err)
		os.Exit(2)
	}
	fmt.Printf("base %s call %s pid %d\n", cc.base, g.Dir(), os.Getpid())
	io.Copy(io.Discard, os.Stdin)
	g.Kill()
	cmd.Wait()
	g.Remove(5 * time.Second)
}

// helper is a helper process of this test binary.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startHelper starts this binary as a helper in mode, in a new PID
// namespace, and moves it into the cgroup dir before it goes on ("" leaves
// it where it is); attr adds to how it is started.
func startHelper(t *testing.T, mode, dir string, attr *syscall.SysProcAttr, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCgroupHelperProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	attr.Cloneflags |= syscall.CLONE_NEWPID
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a new PID namespace here: %v", err)
	}
	h := &helper{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		h.stdin.Close()
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) // pid 1 of its namespace: all of it
		cmd.Wait()
	})
	if dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("moving the helper into %s: %v", dir, err)
		}
	}
	return h
}

func (h *helper) goOn(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

// line is the helper's next line of output.
func (h *helper) line(t *testing.T) string {
	t.Helper()
	line, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("the helper said %q, then: %v", line, err)
	}
	return strings.TrimSpace(line)
}

// sharedTestCgroup makes a cgroup under this process's own for workers to
// share, removed (with what is under it) at the end, or skips where this
// process may not make one.
func sharedTestCgroup(t *testing.T) string {
	t.Helper()
	mount, err := unifiedMount()
	own, oerr := ownCgroup()
	if err != nil || oerr != nil || os.Geteuid() != 0 {
		t.Skip("needs root and a cgroup v2 hierarchy")
	}
	var r [4]byte
	rand.Read(r[:])
	dir := filepath.Join(mount, own, "fluksio-test-shared-"+hex.EncodeToString(r[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	t.Cleanup(func() {
		(&CallCgroup{dir: dir, fd: -1}).Kill()
		removeTree(dir)
		if err := (&CallCgroup{dir: dir, fd: -1}).Remove(5 * time.Second); err != nil {
			t.Errorf("removing the test's shared cgroup: %v", err)
		}
	})
	return dir
}

// Two workers started from one cgroup in two PID namespaces each keep
// their own subtree and calls: the second to start neither takes the
// first's for its own (both are pid 1 of their namespace) nor for a gone
// worker's (the first's pid is no process in the second's namespace).
// So do two in the root cgroup (of a cgroup namespace), where their calls'
// cgroups are made side by side.
func TestWorkersInOtherPIDNamespacesKeepTheirCalls(t *testing.T) {
	for _, tc := range []struct{ name, first, second string }{
		{"same-pid", "worker", "worker"},          // both pid 1
		{"other-pid", "nest", "worker"},           // the first's pid is unknown to the second
		{"root-cgroup", "root-nest", "root-nest"}, // calls' cgroups side by side
	} {
		t.Run(tc.name, func(t *testing.T) {
			shared := sharedTestCgroup(t)
			a := startHelper(t, tc.first, shared, nil)
			a.goOn(t)
			var aBase, aCall string
			var aPid int
			said := a.line(t)
			if _, err := fmt.Sscanf(said, "base %s call %s pid %d", &aBase, &aCall, &aPid); err != nil {
				t.Fatalf("the first worker said %q", said)
			}
			if tc.first != "worker" && aPid == 1 {
				t.Fatal("the first worker is pid 1 of its namespace; this test shows nothing")
			}
			if tc.first == "root-nest" {
				// It sees the shared cgroup as the root.
				if aBase != filepath.Dir(aCall) || !strings.HasPrefix(filepath.Base(aCall), "fluksio-call-") {
					t.Fatalf("the first worker's call %s is not in its root cgroup %s", aCall, aBase)
				}
				aCall, aBase = filepath.Join(shared, filepath.Base(aCall)), shared
			}
			first := &CallCgroup{dir: aCall, fd: -1}
			if !first.Populated() {
				t.Fatalf("the first worker's call cgroup %s is empty", aCall)
			}

			b := startHelper(t, tc.second, shared, nil)
			b.goOn(t)
			said = b.line(t)
			var bBase, bCall string
			var bPid int
			if _, err := fmt.Sscanf(said, "base %s call %s pid %d", &bBase, &bCall, &bPid); err != nil {
				t.Fatalf("the second worker said %q", said)
			}
			if tc.second == "root-nest" {
				bCall, bBase = filepath.Join(shared, filepath.Base(bCall)), shared+"/"
			}
			if bBase == aBase || bCall == aCall {
				t.Errorf("both workers took %s for their own", aBase)
			}
			if !first.Populated() {
				t.Errorf("the first worker's running call (%s) was killed when the second started", aCall)
			}
			if _, err := os.Stat(aBase); err != nil {
				t.Errorf("the first worker's subtree is gone: %v", err)
			}
			for _, h := range []*helper{a, b} {
				h.stdin.Close()
				if err := h.cmd.Wait(); err != nil {
					t.Errorf("a worker ended: %v", err)
				}
			}
		})
	}
}

// A subtree whose worker is gone is removed by the next worker to start,
// with what still runs in it; one whose lock is held is left, though its
// name is no process's.
func TestGoneWorkersSubtreeIsRemovedLockedOneIsNot(t *testing.T) {
	shared := sharedTestCgroup(t)
	gone := filepath.Join(shared, subtreePrefix+"999999999.1")
	held := filepath.Join(shared, subtreePrefix+"999999998.1")
	for _, dir := range []string{gone, held} {
		if err := os.MkdirAll(filepath.Join(dir, "call-x"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, workerLeaf), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	left := startSleeper(t)
	if err := os.WriteFile(filepath.Join(gone, "call-x", "cgroup.procs"), []byte(strconv.Itoa(left.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	fd, err := makeLocked(held, true)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	clearGoneWorkers(shared, "")
	if _, err := os.Stat(gone); err == nil {
		t.Errorf("the gone worker's subtree %s is still there", gone)
	}
	if err := left.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("what the gone worker's call left ended with %v, want killed", err)
	}
	if _, err := os.Stat(filepath.Join(held, "call-x")); err != nil {
		t.Errorf("the subtree of a worker holding its lock was removed: %v", err)
	}
}

// cgroup.procs lists a process that the reader cannot see (one of another
// PID namespace, outside its own) as 0; kill(2) takes 0 for the caller's
// own process group. Signal must leave it: here a worker in a PID
// namespace of its own signals a cgroup holding a process of the host's,
// and a process in the worker's own group is not touched.
func TestSignalSendsNothingToProcessesItCannotSee(t *testing.T) {
	g := testCgroup(t, "unseen")
	sleeperIn(t, g)
	h := startHelper(t, "signal", "", &syscall.SysProcAttr{Setpgid: true}, "CGROUP="+g.Dir())
	canary := exec.Command("sleep", "1000")
	canary.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: h.cmd.Process.Pid}
	if err := canary.Start(); err != nil {
		t.Fatalf("starting a process in the helper's group: %v", err)
	}
	defer canary.Process.Kill()
	h.goOn(t)
	if said := h.line(t); said != "found=true" {
		t.Errorf("Signal of a cgroup holding a process it cannot see said %q, want found=true", said)
	}
	if err := h.cmd.Wait(); err != nil {
		t.Errorf("the helper ended: %v", err)
	}
	// A SIGKILL the helper sent is the canary's end before this SIGTERM.
	canary.Process.Signal(syscall.SIGTERM)
	err := canary.Wait()
	if ws, ok := canary.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("a process in the signalling worker's own group ended with %v; want SIGTERM from the test, not a signal sent to pid 0", err)
	}
}

// In the root cgroup, a call's cgroup whose lock is free is a gone
// worker's: what runs in it is killed and it is removed. One whose lock is
// held is left, though its name is no process's; so is one of an earlier
// version (a bare pid in its name, never locked) where something runs,
// as its worker may run in another PID namespace: a warning says how to
// remove it.
func TestRootLeftoversOfGoneWorkersOnly(t *testing.T) {
	shared := sharedTestCgroup(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	in := func(dir string) *exec.Cmd {
		t.Helper()
		cmd := startSleeper(t)
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	unlocked := filepath.Join(shared, rootCallPrefix+"999999999.1-x")
	earlier := filepath.Join(shared, rootCallPrefix+strconv.Itoa(gone.Process.Pid)+"-x")
	for _, dir := range []string{unlocked, earlier} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	left := in(unlocked)
	in(earlier)
	held, err := (&CallCgroups{base: shared, prefix: rootCallPrefix + "999999998.1-"}).New("y")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Remove(5 * time.Second)
	defer held.Kill()
	in(held.Dir())

	cc := &CallCgroups{base: shared}
	notes := cc.clearRootLeftovers()
	if _, err := os.Stat(unlocked); err == nil {
		t.Errorf("the gone worker's cgroup %s is still there", unlocked)
	}
	if err := left.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("what the gone worker's call left ended with %v, want killed", err)
	}
	if !held.Populated() {
		t.Errorf("the call of a worker holding its cgroup's lock was killed")
	}
	if !populated(earlier) {
		t.Errorf("an earlier version's cgroup with processes in it was not left alone")
	}
	if len(notes) != 1 || !strings.Contains(notes[0], earlier) || !strings.Contains(notes[0], "cgroup.kill") {
		t.Errorf("what was left alone was said as %q; want one line naming %s and how to remove it", notes, earlier)
	}
}

// A worker re-executed for a reload (same pid, still in the leaf of its
// subtree) takes that subtree again; any other starts one of its own in
// the cgroup it is in, named for its pid and PID namespace.
func TestOwnSubtreeAfterAReload(t *testing.T) {
	mine := subtreePrefix + strconv.Itoa(os.Getpid()) + ".4026531836"
	if shared, subtree := ownSubtree("/a/b/" + mine + "/" + workerLeaf); shared != "/a/b" || subtree != mine {
		t.Errorf("in its own leaf after a reload: %s, %s; want /a/b, %s", shared, subtree, mine)
	}
	fresh := subtreePrefix + workerID()
	for _, own := range []string{"/a/b", "/a/" + subtreePrefix + "1.4026531836/" + workerLeaf, "/a/" + mine} {
		if shared, subtree := ownSubtree(own); shared != own || subtree != fresh {
			t.Errorf("started in %s: %s, %s; want %s, %s", own, shared, subtree, own, fresh)
		}
	}
	if !strings.HasPrefix(fresh, subtreePrefix+strconv.Itoa(os.Getpid())+".") {
		t.Errorf("a new subtree is %s, not named for this process's pid and namespace", fresh)
	}
}
