package platform

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Containment on Linux without a cgroup of our own: the worker is a child
// subreaper, so a process that leaves its call's process group (setsid, a
// double fork) is re-parented to the worker rather than to init, and every
// runner carries a per-call cookie in its environment, which everything
// it starts inherits. At the end of a call every process of this user
// carrying the cookie is stopped, wherever it went; the way Jenkins' process
// tree killer finds a build's processes. A process that clears its own
// environment escapes the cookie; only a cgroup holds it.

// SetupContainment prepares this process to contain its calls and says how
// it does: ContainSubreaper, or ContainProcessGroup when the kernel refuses
// to make it a subreaper.
func SetupContainment() (string, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return ContainProcessGroup, err
	}
	return ContainSubreaper, nil
}

// starting is held for reading while a runner is being started and
// registered, and for writing while orphans are reaped: a runner that dies
// at once must not be reaped before os/exec can wait for it. The reaper
// only tries it: a runner being adopted from a zygote holds it for as long
// as the zygote takes to answer (seconds, for a wedged one), and neither
// the end of a call nor another runner's start (which a waiting writer
// would hold back) may wait for that. What is not reaped now is at the
// next look.
var (
	starting  sync.RWMutex
	runners   = map[int]struct{}{}
	runnersMu sync.Mutex
)

// StartContained starts cmd and registers its process as one os/exec
// waits for, which ReapOrphans leaves alone. Call Forget once Wait returns.
func StartContained(cmd *exec.Cmd) error {
	starting.RLock()
	defer starting.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	runnersMu.Lock()
	runners[cmd.Process.Pid] = struct{}{}
	runnersMu.Unlock()
	return nil
}

// Adopt runs start, which makes a runner this process did not fork itself
// (a zygote's fork: the zygote's child, re-parented to this subreaper
// should the zygote die first) and returns its pid, and registers that pid
// as StartContained does: ReapOrphans leaves it to whoever waits for it.
// Call Forget once it is waited for.
func Adopt(start func() (int, error)) (int, error) {
	starting.RLock()
	defer starting.RUnlock()
	pid, err := start()
	if err != nil {
		return 0, err
	}
	runnersMu.Lock()
	runners[pid] = struct{}{}
	runnersMu.Unlock()
	return pid, nil
}

// IsSubreaper reports whether this process adopts its descendants'
// orphans (SetupContainment made it a child subreaper).
func IsSubreaper() bool {
	var on int32
	err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&on)), 0, 0, 0)
	return err == nil && on != 0
}

// Forget drops a runner that os/exec has waited for.
func Forget(pid int) {
	runnersMu.Lock()
	delete(runners, pid)
	runnersMu.Unlock()
}

// FindCookie lists the live processes of this user whose environment holds
// name=value, leaving out those in process group skipGroup (they are
// signalled as a group) and this process.
func FindCookie(name, value string, skipGroup int) []int {
	entry := []byte(name + "=" + value + "\x00")
	uid := uint32(os.Geteuid())
	self := os.Getpid()
	var found []int
	forEachProc(func(pid int, dir string) {
		if pid == self {
			return
		}
		var st syscall.Stat_t
		if syscall.Stat(dir, &st) != nil || (uid != 0 && st.Uid != uid) {
			return
		}
		env, err := os.ReadFile(dir + "/environ")
		if err != nil || len(env) == 0 {
			return // gone, a zombie, or a kernel thread
		}
		if !bytes.HasPrefix(env, entry) && !bytes.Contains(env, append([]byte{0}, entry...)) {
			return
		}
		if s, ok := readStat(pid); ok && (s.state == 'Z' || s.pgid == skipGroup) {
			return
		}
		found = append(found, pid)
	})
	return found
}

// ProcessAlive reports whether pid is a process that has not yet exited
// (a zombie counts as exited).
func ProcessAlive(pid int) bool {
	s, ok := readStat(pid)
	return ok && s.state != 'Z'
}

// ReapOrphans waits for every zombie this process adopted as a subreaper:
// its children that are neither runners os/exec waits for (nor the Python
// version check, registered as they are) nor in this process's own group
// (where os/exec's other commands run). It returns how many it reaped.
func ReapOrphans() int {
	// A cheap look first: is any child of this process a zombie at all?
	// (WNOWAIT leaves it waitable; os/exec's own waits are not disturbed.)
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil || info.Signo == 0 {
		return 0
	}
	if !starting.TryLock() {
		return 0
	}
	defer starting.Unlock()
	self, ownGroup := os.Getpid(), syscall.Getpgrp()
	reaped := 0
	forEachChild(self, func(pid int) {
		s, ok := readStat(pid)
		if !ok || s.state != 'Z' || s.ppid != self || s.pgid == ownGroup {
			return
		}
		runnersMu.Lock()
		_, runner := runners[pid]
		runnersMu.Unlock()
		if runner {
			return
		}
		var ws syscall.WaitStatus
		if got, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); got == pid {
			reaped++
		}
	})
	return reaped
}

// RaiseOOMScore makes the kernel's out-of-memory killer prefer pid (and
// what it starts afterwards, which inherits the value) over the worker.
// Written with the bare system calls, once a runner: os.WriteFile would
// also try a /proc file in the poller and put it back (five more).
func RaiseOOMScore(pid, adj int) error {
	path := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, strconv.AppendInt(nil, int64(adj), 10)); err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// MaxRSSBytes converts rusage's maxrss, which Linux gives in KiB.
func MaxRSSBytes(maxrss int64) int64 { return maxrss << 10 }

type procStat struct {
	state byte
	ppid  int
	pgid  int
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	return procStat{state: f[0][0], ppid: ppid, pgid: pgid}, true
}

// forEachChild calls fn with each child of process self, as its threads'
// children files list them (an orphan adopted by a subreaper becomes the
// child of one of its threads): a handful of reads where the whole of
// /proc is one a process on the machine. Without those files (a kernel
// built without them) it calls fn with every process.
func forEachChild(self int, fn func(pid int)) {
	if !childrenListed() {
		forEachProc(func(pid int, _ string) { fn(pid) })
		return
	}
	dir := "/proc/" + strconv.Itoa(self) + "/task/"
	tasks, _ := os.ReadDir(dir)
	for _, task := range tasks {
		b, err := os.ReadFile(dir + task.Name() + "/children")
		if err != nil {
			continue // the thread ended meanwhile
		}
		for _, field := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(field)); err == nil {
				fn(pid)
			}
		}
	}
}

// childrenListed reports whether this kernel lists a thread's children
// in /proc (CONFIG_PROC_CHILDREN).
var childrenListed = sync.OnceValue(func() bool {
	self := strconv.Itoa(os.Getpid())
	_, err := os.Stat("/proc/" + self + "/task/" + self + "/children")
	return err == nil
})

func forEachProc(fn func(pid int, dir string)) {
	d, err := os.Open("/proc")
	if err != nil {
		return
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		fn(pid, "/proc/"+n)
	}
}
