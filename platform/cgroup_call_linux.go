package platform

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Containment by cgroup v2, where the worker may write its cgroup (root,
// or a systemd service with Delegate=yes): each call runs in a cgroup of
// its own, the runner started directly into it (clone3 with
// CLONE_INTO_CGROUP, so nothing of the call runs outside it even briefly),
// and at the end everything in it is signalled, killed with cgroup.kill
// and the cgroup removed. Nothing can leave a cgroup it cannot write.

// CallCgroups is where the calls' cgroups are made.
type CallCgroups struct {
	base   string
	prefix string // of a call's cgroup name; a spare's and a zygote's say their role instead
	// cloneInto: processes can be started straight into a cgroup. A
	// seccomp filter may deny clone3 (systemd-nspawn's and Docker's answer
	// ENOSYS); then the runner is moved in right after it starts, before
	// Python has started anything.
	cloneInto bool
	// memory: the memory controller is enabled for the calls' cgroups, so
	// they have memory.events and memory.peak. Learnt once, at setup:
	// looking for the files per call cost an open or a stat each.
	memory bool
	// watch says which calls' cgroups were changed, so that the others
	// may be reused (cgroup_reuse_linux.go); nil where they are not.
	watch *cgroupWatch
	// lock is the worker's subtree, open and locked for the worker's
	// life (cgroup_owner_linux.go); -1 in the root cgroup, where each
	// call's cgroup is locked instead.
	lock int
	// leftAlone says which cgroups that may be leftovers were left at
	// setup, as their owner could not be told gone.
	leftAlone []string
	// limits are the calls' limits (calllimits_linux.go); nil: none.
	limits *limitSet
}

// LeftAlone says, one line each, which cgroups that may be a gone
// worker's leftovers were left alone at setup, and how to remove them.
func (cc *CallCgroups) LeftAlone() []string { return cc.leftAlone }

// In a cgroup of its own (a systemd service with Delegate=yes, a user's
// scope), the worker makes a subtree named for it (workerID: its pid and
// PID namespace) and moves itself into a leaf of it, as cgroup v2 lets a
// cgroup with controllers enabled for its children hold no processes; its
// calls' cgroups are made next to that leaf:
//
//	<own cgroup>/worker-<id>/worker     the worker
//	<own cgroup>/worker-<id>/call-…     its calls
//	<own cgroup>/worker-<id>/spare-…    its spares, waiting for a call
//	<own cgroup>/worker-<id>/zygote-…   its zygotes
//
// Several workers started from one cgroup (one per GPU, from one terminal
// or tmux session, or in containers that share it) each own their subtree,
// locked for as long as they run (cgroup_owner_linux.go), and one clears
// at start only the subtrees of workers that are gone.
const (
	workerLeaf    = "worker"
	subtreePrefix = "worker-"
	// rootCallPrefix begins the name of a call's cgroup made in the root
	// cgroup: fluksio-call-<id>-… (fluksio-spare-<id>-… for a spare's).
	rootCallPrefix = "fluksio-call-"
)

// prefixFor is the name prefix of a cgroup made for role: the call's
// prefix with the role in place of "call".
func (cc *CallCgroups) prefixFor(role CgroupRole) string {
	return strings.Replace(cc.prefix, "call-", role.String()+"-", 1)
}

// unifiedMount finds the cgroup v2 hierarchy: /sys/fs/cgroup, or
// /sys/fs/cgroup/unified on hybrid hosts.
func unifiedMount() (string, error) {
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return dir, nil
		}
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted")
}

// SetupCgroups prepares cgroups for calls under this process's own cgroup,
// moving this process into a leaf of it. It fails when the hierarchy is
// missing or not writable here.
func SetupCgroups() (*CallCgroups, error) {
	mount, err := unifiedMount()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	cc := &CallCgroups{prefix: "call-", lock: -1}
	if own == "/" {
		// The root cgroup may hold processes next to children, and other
		// workers may share it: calls get cgroups right under it, named
		// so that nothing else's is taken for a worker's leftover, and no
		// cgroup of the worker's own is left if it is killed outright.
		cc.base, cc.prefix = mount, rootCallPrefix+workerID()+"-"
		if err := unix.Access(mount, unix.W_OK); err != nil {
			return nil, fmt.Errorf("the root cgroup %s is not writable: %w", mount, err)
		}
		cc.leftAlone = cc.clearRootLeftovers()
		cc.cloneInto = cc.probeCloneInto()
		cc.setReuse(memoryEnabled(mount))
		return cc, nil
	}
	shared, subtree := ownSubtree(own)
	shared = filepath.Join(mount, shared)
	cc.base = filepath.Join(shared, subtree)
	leaf := filepath.Join(cc.base, workerLeaf)
	// Locked before anything is in it, and for the worker's life (the
	// descriptor is never closed): the lock says the subtree is a running
	// worker's to workers in any PID namespace.
	lock, err := makeLocked(cc.base, true)
	if err != nil {
		return nil, fmt.Errorf("making the worker's own cgroup: %w", err)
	}
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		unix.Close(lock)
		return nil, fmt.Errorf("making the worker's own cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		os.Remove(leaf)
		os.Remove(cc.base)
		unix.Close(lock)
		return nil, fmt.Errorf("moving the worker into %s: %w", leaf, err)
	}
	cc.lock = lock
	// Controllers for the calls where they are available: memory gives
	// memory.events (OOM kills) and memory.peak. Best effort: the shared
	// cgroup cannot enable any while another process still runs in it.
	for _, dir := range []string{shared, cc.base} {
		enableControllers(dir)
	}
	clearGoneWorkers(shared, subtree)
	cc.clearLeftovers()
	cc.cloneInto = cc.probeCloneInto()
	cc.setReuse(memoryEnabled(cc.base))
	return cc, nil
}

// setReuse says whether the calls' cgroups get the memory controller and,
// where they do not, watches them so that they can be reused.
func (cc *CallCgroups) setReuse(memory bool) {
	cc.memory = memory
	if !memory {
		cc.watch = newCgroupWatch()
	}
}

// memoryEnabled reports whether the calls' cgroups, made in base, get the
// memory controller: base passes it on to its children.
func memoryEnabled(base string) bool {
	b, _ := os.ReadFile(filepath.Join(base, "cgroup.subtree_control"))
	return hasController(strings.ReplaceAll(strings.TrimSpace(string(b)), " ", ","), "memory")
}

func enableControllers(dir string) {
	ctrl, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return
	}
	for _, c := range []string{"memory", "pids", "cpu"} {
		if strings.Contains(" "+strings.TrimSpace(string(ctrl))+" ", " "+c+" ") {
			os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0)
		}
	}
}

// CloneInto reports whether runners are started straight into their cgroup.
func (cc *CallCgroups) CloneInto() bool { return cc.cloneInto }

// probeCloneInto starts this executable (--version) straight into a
// cgroup, to learn whether clone3 into a cgroup is allowed here.
func (cc *CallCgroups) probeCloneInto() bool {
	exe, err := os.Executable()
	if err != nil {
		return false
	}
	g, err := cc.New("probe-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		return false
	}
	defer g.Remove(time.Second)
	cmd := exec.Command(exe, "--version")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: g.fd}
	return cmd.Run() == nil
}

// removeTree removes the cgroups under dir, deepest first: a cgroup with
// children cannot be removed, and a leftover may hold a worker's own
// subtree (a process started in it that made cgroups of its own).
// Their processes must be gone (Kill).
func removeTree(dir string) {
	var under []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != dir {
			under = append(under, path)
		}
		return nil
	})
	for i := len(under) - 1; i >= 0; i-- { // children before their parents
		os.Remove(under[i])
	}
}

// clearLeftovers kills and removes the calls' (and spares' and zygotes')
// cgroups of this worker's own subtree, left from before a reload
// re-executed it.
func (cc *CallCgroups) clearLeftovers() {
	var dirs []string
	for role := range cgroupRoles {
		found, _ := filepath.Glob(filepath.Join(cc.base, cc.prefixFor(CgroupRole(role))+"*"))
		dirs = append(dirs, found...)
	}
	for _, dir := range dirs {
		g := &CallCgroup{dir: dir, fd: -1}
		g.Kill()
		g.Remove(time.Second)
	}
}

func ownCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if path, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return path, nil
		}
	}
	return "", errors.New("this process has no cgroup v2 path")
}

// CallCgroup is one call's cgroup.
type CallCgroup struct {
	dir       string
	fd        int // the directory, for starting runners into it; -1 once removed
	cloneInto bool
	role      CgroupRole // what it was made for, which its name says
	memory    bool       // it has memory.events and memory.peak
	watcher   *cgroupWatch
	watch     int32         // its watch for changes; -1 without one
	cpuBase   time.Duration // cpu.stat's usage when it was handed to this call
	// handedOn: the cgroup was handed to another call (Reuse), and this
	// value, which its last call's box may still hold, stands for nothing
	// any more: it signals, kills, moves and removes nothing, and says the
	// cgroup is empty.
	handedOn atomic.Bool
	// The files read at every call, open from the cgroup's making: a
	// kernfs file costs more to open than to read, and a call looks at
	// cgroup.events several times. nil for a cgroup found, not made (a
	// leftover): then they are read by path.
	events, cpuStat *os.File
	limits          *callLimitCgroups // its limits and v1 cgroups; nil: none
}

// New makes a call's cgroup, locked for as long as this worker has it
// (until Remove): in the root cgroup, where workers in other PID
// namespaces may make theirs too, the lock is what says it is a running
// worker's.
func (cc *CallCgroups) New(name string) (*CallCgroup, error) {
	return cc.NewFor(CgroupCall, name)
}

// NewFor makes a cgroup for role, as New makes a call's: named for the
// role (spare-…, zygote-…).
func (cc *CallCgroups) NewFor(role CgroupRole, name string) (*CallCgroup, error) {
	dir := filepath.Join(cc.base, cc.prefixFor(role)+name)
	fd, err := makeLocked(dir, false)
	if err != nil {
		os.Remove(dir)
		return nil, err
	}
	g := &CallCgroup{dir: dir, fd: fd, cloneInto: cc.cloneInto, role: role, memory: cc.memory, watcher: cc.watch}
	g.events = openAt(fd, dir, "cgroup.events")
	g.cpuStat = openAt(fd, dir, "cpu.stat")
	g.watch = cc.watch.add(dir)
	if err := cc.applyLimits(g, name); err != nil {
		g.Remove(0)
		return nil, err
	}
	return g, nil
}

// openAt opens name in the directory dirFD, or returns nil (it is then
// read by path, as a leftover's).
func openAt(dirFD int, dir, name string) *os.File {
	fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, name))
}

// read reads one of the cgroup's files into buf: f, kept open, when there
// is one, else name by path. A kept file closed by Remove reads as a
// removed cgroup's: not at all.
func (g *CallCgroup) read(f *os.File, name string, buf []byte) []byte {
	if g.handedOn.Load() {
		return nil
	}
	if f == nil {
		b, _ := os.ReadFile(filepath.Join(g.dir, name))
		return b
	}
	n, _ := f.ReadAt(buf, 0)
	return buf[:n]
}

// Dir is the cgroup's directory.
func (g *CallCgroup) Dir() string { return g.dir }

// Role is what the cgroup was made for, which its name says.
func (g *CallCgroup) Role() CgroupRole { return g.role }

// Prepare makes cmd start inside the cgroup.
func (g *CallCgroup) Prepare(cmd *exec.Cmd) {
	if !g.cloneInto {
		return
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = g.fd
}

// Started puts the runner into the cgroup where it could not be started
// there. It reports whether the runner is in.
func (g *CallCgroup) Started(pid int) error {
	if g.cloneInto {
		return g.enterLimits(pid)
	}
	return g.Move(pid)
}

// Move puts a process that was started elsewhere (forked by a zygote)
// into the cgroup.
func (g *CallCgroup) Move(pid int) error {
	if g.handedOn.Load() {
		return errors.New("the cgroup was handed to another call")
	}
	if err := os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return err
	}
	return g.enterLimits(pid)
}

func (g *CallCgroup) closeFD() {
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
}

// Procs lists the processes in the cgroup that this process can see, and
// reports whether it holds any it cannot: cgroup.procs lists a process of
// another PID namespace, outside this one's, as 0, which kill(2) would
// take for this process's own group.
func (g *CallCgroup) Procs() (pids []int, unseen bool) {
	if g.handedOn.Load() {
		return nil, false
	}
	b, _ := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		} else if err == nil {
			unseen = true
		}
	}
	return pids, unseen
}

// Signal sends sig to every process in the cgroup outside process group
// skipGroup (signalled as a group) that this process can see. It reports
// whether any was there, seen or not. The list is read only where
// cgroup.events says a process is there: at the end of most calls none is.
func (g *CallCgroup) Signal(sig syscall.Signal, skipGroup int) bool {
	if !g.Populated() {
		return false
	}
	pids, unseen := g.Procs()
	for _, pid := range pids {
		if s, ok := readStat(pid); ok && s.pgid == skipGroup {
			continue
		}
		syscall.Kill(pid, sig)
	}
	return len(pids) > 0 || unseen
}

// Populated reports whether any process is left in the cgroup.
func (g *CallCgroup) Populated() bool {
	var buf [128]byte
	return keyedValueOf(g.read(g.events, "cgroup.events", buf[:]), "populated") > 0
}

// WaitEmpty waits up to wait for the cgroup to hold no process, and
// reports whether it is empty. Exited processes leave at once, before they
// are reaped. The kernel wakes the wait: it marks cgroup.events changed
// (POLLPRI) when the cgroup's last process leaves, so the wait ends then,
// not at the next look of a poll loop, and costs nothing meanwhile.
func (g *CallCgroup) WaitEmpty(wait time.Duration) bool {
	if g.handedOn.Load() {
		return true
	}
	deadline := time.Now().Add(wait)
	if g.events != nil {
		rc, err := g.events.SyscallConn()
		if err != nil {
			return !g.Populated()
		}
		var empty bool
		if rc.Control(func(fd uintptr) { empty = g.waitEmpty(int(fd), deadline) }) != nil {
			return !g.Populated() // removed meanwhile
		}
		return empty
	}
	fd, err := unix.Open(filepath.Join(g.dir, "cgroup.events"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return !g.Populated() // gone already, or unreadable: as Populated says
	}
	defer unix.Close(fd)
	return g.waitEmpty(fd, deadline)
}

// waitEmpty is WaitEmpty on fd, cgroup.events open.
func (g *CallCgroup) waitEmpty(fd int, deadline time.Time) bool {
	var buf [128]byte
	for {
		// Reading the file arms the notification: a change after this
		// read wakes the poll below, one before it is read here.
		n, err := unix.Pread(fd, buf[:], 0)
		if err != nil {
			return !g.Populated()
		}
		if keyedValueOf(buf[:n], "populated") == 0 {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		ms := int((left + time.Millisecond - 1) / time.Millisecond)
		_, err = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}, ms)
		if err != nil && err != unix.EINTR {
			return !g.Populated()
		}
	}
}

// Kill kills everything in the cgroup: cgroup.kill (Linux 5.14), else
// SIGKILL to each process it lists.
func (g *CallCgroup) Kill() {
	if g.handedOn.Load() {
		return
	}
	if os.WriteFile(filepath.Join(g.dir, "cgroup.kill"), []byte("1"), 0) != nil {
		pids, _ := g.Procs()
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Remove waits up to wait for the cgroup to be empty, then removes it.
// What it says after is what a removed cgroup says: nothing in it.
func (g *CallCgroup) Remove(wait time.Duration) error {
	if g.handedOn.Load() {
		return nil
	}
	// The directory stays open, and so locked, until it is removed: a
	// worker clearing leftovers must not take it for a gone worker's.
	defer g.closeFD()
	g.watcher.drop(g.watch)
	for _, f := range []*os.File{g.events, g.cpuStat} {
		if f != nil {
			f.Close()
		}
	}
	deadline := time.Now().Add(wait)
	for {
		err := os.Remove(g.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return g.removeLimits(time.Until(deadline))
		}
		if time.Now().After(deadline) {
			return err
		}
		ReapOrphans()
		time.Sleep(10 * time.Millisecond)
	}
}

// PeakMemory is memory.peak in bytes (0 where the kernel or controller lacks it).
func (g *CallCgroup) PeakMemory() int64 {
	if !g.memory {
		return 0
	}
	b, _ := os.ReadFile(filepath.Join(g.dir, "memory.peak"))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// CPU is the CPU time of every process that ran in the cgroup (cpu.stat)
// since it was made or Reset for another call.
func (g *CallCgroup) CPU() time.Duration {
	if g.handedOn.Load() {
		return 0
	}
	return g.cpuUsage() - g.cpuBase
}

func (g *CallCgroup) cpuUsage() time.Duration {
	var buf [1024]byte
	return time.Duration(keyedValueOf(g.read(g.cpuStat, "cpu.stat", buf[:]), "usage_usec")) * time.Microsecond
}

// keyedValue reads "key value" lines, as cgroup.events and cpu.stat have.
func keyedValue(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return keyedValueOf(b, key)
}

// keyedValueOf is key's value in "key value" lines.
func keyedValueOf(b []byte, key string) int64 {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) > len(key) && line[len(key)] == ' ' && string(line[:len(key)]) == key {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(line[len(key)+1:])), 10, 64)
			return n
		}
	}
	return 0
}

// ProbeCgroups says whether SetupCgroups would succeed here, changing
// nothing.
func ProbeCgroups() error {
	mount, err := unifiedMount()
	if err != nil {
		return err
	}
	own, err := ownCgroup()
	if err != nil {
		return err
	}
	shared, _ := ownSubtree(own)
	return unix.Access(filepath.Join(mount, shared), unix.W_OK)
}
