package platform

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Whose is a cgroup. Workers that share a cgroup parent need not share a
// PID namespace (two systemd-nspawn machines booted from one cgroup, LXC
// or Docker without a cgroup namespace on a hybrid host, a worker started
// under `unshare -p`): a pid in a cgroup's name means nothing to a worker
// in another namespace, where that pid is another process or none. So a
// worker holds an flock on each cgroup it makes (its subtree, its calls'
// cgroups) for as long as it has it; the kernel lets go of the lock
// however the worker ends, and every worker, whatever its namespace, sees
// the same lock on the same cgroup. A worker removes another's cgroup only
// where it can take that lock (its owner is gone) and no worker runs in
// it; and names carry the worker's PID namespace as well as its pid, so
// that two workers never make the same one.

// workerID names this worker's cgroups: its pid and its PID namespace's
// inode number, which no other live namespace has ("1234.4026531836").
// Where the namespace cannot be read (no /proc), a random word stands for
// it. The "." keeps the names apart from those of earlier versions, which
// were the pid alone, and which those versions leave alone.
var workerID = sync.OnceValue(func() string {
	pid := strconv.Itoa(os.Getpid())
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) == nil {
		return pid + "." + strconv.FormatUint(st.Ino, 10)
	}
	var r [8]byte
	rand.Read(r[:])
	return pid + "." + hex.EncodeToString(r[:])
})

// ownSubtree splits own, this process's cgroup, into the cgroup the
// worker was started in and the name of its subtree there: the one it
// made and moved into before a reload re-executed it (same pid, same
// cgroup), else a new one.
func ownSubtree(own string) (shared, subtree string) {
	parent := filepath.Base(filepath.Dir(own))
	if filepath.Base(own) == workerLeaf && strings.HasPrefix(parent, subtreePrefix+strconv.Itoa(os.Getpid())+".") {
		return filepath.Dir(filepath.Dir(own)), parent
	}
	return own, subtreePrefix + workerID()
}

// lockWait bounds the wait for the lock of a cgroup this worker makes:
// another worker clearing leftovers holds it for a moment where it found
// the cgroup between its making and its locking.
const lockWait = 5 * time.Second

// errSwept: the cgroup was removed between its making and its locking,
// by a worker that took it for a dead one's; it is made again.
var errSwept = errors.New("the cgroup was removed as it was being made")

// lockMade takes the lock of dir, a cgroup this worker made (or, after a
// reload, found as its own), open as fd. It fails with errSwept where
// dir was removed meanwhile: another worker clearing leftovers found it
// unlocked, so took it for a dead worker's.
func lockMade(dir string, fd int) error {
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if err != unix.EWOULDBLOCK || time.Now().After(deadline) {
			return fmt.Errorf("locking the cgroup %s: %w (another process holds its flock)", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var held, now unix.Stat_t
	if unix.Fstat(fd, &held) != nil || unix.Stat(dir, &now) != nil || held.Ino != now.Ino || held.Dev != now.Dev {
		return errSwept
	}
	return nil
}

// makeLocked makes dir (found where exist, else a new one is required)
// and takes its lock, making it again where another worker removed it
// before the lock was taken. It returns the directory open, locked.
func makeLocked(dir string, exist bool) (int, error) {
	for try := 0; ; try++ {
		if err := os.Mkdir(dir, 0o755); err != nil && !(exist && errors.Is(err, os.ErrExist)) {
			return -1, err
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			if err = lockMade(dir, fd); err == nil {
				return fd, nil
			}
			unix.Close(fd)
		}
		if (err != errSwept && !errors.Is(err, unix.ENOENT)) || try == 3 {
			return -1, err
		}
	}
}

// tryLock takes the lock of another's cgroup dir where nobody holds it:
// its maker is gone. It returns the directory open, locked, or -1 where
// its maker still holds it (or it is gone).
func tryLock(dir string) int {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		unix.Close(fd)
		return -1
	}
	return fd
}

// populated reports whether a process runs in dir or under it.
func populated(dir string) bool {
	return keyedValue(filepath.Join(dir, "cgroup.events"), "populated") > 0
}

// earlierVersion reports whether id, from a cgroup's name, is a pid alone
// (an earlier version's name, which it never locked), and whether that
// pid is a process here. Such a worker can be told gone only by its pid,
// which says nothing of workers in other PID namespaces: its cgroup is
// removed only where nothing runs in it.
func earlierVersion(id string) (old, alive bool) {
	pid, err := strconv.Atoi(id)
	if err != nil || pid <= 0 {
		return false, false
	}
	return true, syscall.Kill(pid, 0) != syscall.ESRCH
}

// clearGoneWorkers kills and removes the subtrees in shared whose worker
// is gone: what a worker killed outright left. A subtree is a gone
// worker's where its lock is free and nothing runs in its worker's leaf;
// a worker of an earlier version takes no lock, so its subtree is also
// left while its pid is a process here. mine is this worker's own subtree.
func clearGoneWorkers(shared, mine string) {
	dirs, _ := filepath.Glob(filepath.Join(shared, subtreePrefix+"*"))
	for _, dir := range dirs {
		if filepath.Base(dir) == mine {
			continue
		}
		old, alive := earlierVersion(strings.TrimPrefix(filepath.Base(dir), subtreePrefix))
		if old && alive {
			continue
		}
		fd := tryLock(dir)
		if fd < 0 {
			continue // its worker runs
		}
		// A worker in its leaf runs: an earlier version's (no lock), or
		// one re-executing itself for a reload (the lock let go at exec).
		if !populated(filepath.Join(dir, workerLeaf)) {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.IsDir() {
					removeLeftover(filepath.Join(dir, e.Name()))
				}
			}
			os.Remove(dir)
		}
		unix.Close(fd)
	}
}

// clearRootLeftovers removes calls' cgroups in the root cgroup whose
// worker is gone: their lock is free. It returns those it left alone
// though they may be leftovers: an earlier version's (no lock) where
// something still runs, as that version's worker may run in another
// PID namespace.
func (cc *CallCgroups) clearRootLeftovers() []string {
	var left []string
	for role := range cgroupRoles {
		prefix := rootPrefix(CgroupRole(role))
		dirs, _ := filepath.Glob(filepath.Join(cc.base, prefix+"*"))
		left = append(left, clearRootCgroups(dirs, prefix)...)
	}
	return left
}

// rootPrefix begins the name of a cgroup made for role in the root
// cgroup: fluksio-<role>-.
func rootPrefix(role CgroupRole) string {
	return strings.Replace(rootCallPrefix, "call-", role.String()+"-", 1)
}

// clearRootCgroups is clearRootLeftovers for the cgroups dirs, whose
// names begin with prefix.
func clearRootCgroups(dirs []string, prefix string) []string {
	var left []string
	for _, dir := range dirs {
		id, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), prefix), "-")
		old, alive := earlierVersion(id)
		if old && alive {
			continue
		}
		fd := tryLock(dir)
		if fd < 0 {
			continue // its worker has it
		}
		if old && populated(dir) {
			left = append(left, fmt.Sprintf("%s holds processes, and the pid in its name is no process here: the worker of an earlier version that made it may run in another PID namespace, or was killed and left them. If no worker runs it, end them: echo 1 > %s; rmdir %s",
				dir, filepath.Join(dir, "cgroup.kill"), dir))
		} else {
			removeLeftover(dir)
		}
		unix.Close(fd)
	}
	return left
}

// removeLeftover kills what runs in dir, a gone worker's cgroup, and
// removes it with the cgroups under it.
func removeLeftover(dir string) {
	g := &CallCgroup{dir: dir, fd: -1}
	if g.Populated() {
		// Only then: a process later started straight into a cgroup
		// ever killed through cgroup.kill is killed at birth.
		g.Kill()
	}
	removeTree(dir)
	g.Remove(time.Second)
}
