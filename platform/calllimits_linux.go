package platform

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Per-call limits. Each is set where the kernel can hold the call to it:
// in the call's cgroup v2 where that controller is enabled for the calls'
// cgroups (a pure cgroup v2 host, a unit with Delegate=yes), else in a
// cgroup of the call's own in the controller's v1 hierarchy (hybrid hosts,
// where memory, pids and cpu live in v1), made beside the call's v2 cgroup
// and removed with it; the runner is put in both before node code runs.
// Where neither can be had, SetLimits fails: a limit is never ignored.
//
// Calls' cgroups with limits are not reused (cgroup_reuse_linux.go): a
// reused cgroup would carry its last call's memory and pids counters, and
// the v1 cgroups beside it would have to be handed on with it.

// limitSet is where the calls' limits are written.
type limitSet struct {
	limits CallLimits
	v2     []limitFile // written in the call's v2 cgroup
	v1     []v1Limit   // one per v1 hierarchy the call gets a cgroup in
	prefix string      // of the calls' v1 cgroups' names: fluksio-call-PID-
}

// limitFile is one value written to a cgroup file. An optional one (swap)
// is left where the kernel has no such file.
type limitFile struct {
	name, value string
	optional    bool
}

// v1Limit is one v1 hierarchy: the calls' cgroups there are made in the
// worker's own.
type v1Limit struct {
	ctrl   string
	parent string
	files  []limitFile
}

// callLimitCgroups is what a call's cgroup holds of its limits: the
// limits, and its cgroups in v1 hierarchies.
type callLimitCgroups struct {
	set *limitSet
	v1  []string // directories, one per v1Limit
}

// ErrNoController is what SetLimits's error wraps where a limit's
// controller cannot be had here at all (rather than a value refused).
var ErrNoController = errors.New("the controller cannot be had here")

// limitFlags name each controller's option, for what SetLimits says.
var limitFlags = map[string]string{"memory": "--call-memory-max", "pids": "--call-pids-max", "cpu": "--call-cpu-max"}

// SetLimits makes every call's cgroup made from now on hold limits l, or
// says which limit cannot be had here and what to do. It makes and
// removes one cgroup to try them, so that a value the kernel refuses is
// said now, not at each call.
func (cc *CallCgroups) SetLimits(l CallLimits) error {
	if !l.Any() {
		return nil
	}
	ls := &limitSet{limits: l, prefix: "fluksio-call-" + strconv.Itoa(os.Getpid()) + "-"}
	own := ownV1Cgroups()
	need := func(ctrl string, v2, v1 []limitFile) error {
		if controllerEnabled(cc.base, ctrl) {
			ls.v2 = append(ls.v2, v2...)
			return nil
		}
		parent, ok := own[ctrl]
		if !ok {
			return fmt.Errorf("%s: the calls' cgroups (%s) do not get the %s controller, and no cgroup v1 %s hierarchy is mounted; run the worker where it may enable that controller for its cgroup (a systemd unit with Delegate=yes, as 'fluksio-worker install' writes, or root), or leave %s out (%w)",
				limitFlags[ctrl], cc.base, ctrl, ctrl, limitFlags[ctrl], ErrNoController)
		}
		if err := unix.Access(parent, unix.W_OK); err != nil {
			return fmt.Errorf("%s: the calls' cgroups (%s) do not get the %s controller, and this worker may not make cgroups in its cgroup v1 %s hierarchy %s (%v); run it as root or in a systemd unit with Delegate=yes, or leave %s out (%w)",
				limitFlags[ctrl], cc.base, ctrl, ctrl, parent, err, limitFlags[ctrl], ErrNoController)
		}
		ls.v1 = append(ls.v1, v1Limit{ctrl: ctrl, parent: parent, files: v1})
		return nil
	}
	if n := l.MemoryMax; n > 0 {
		v := strconv.FormatInt(n, 10)
		// Swap is held to nothing beyond it: a call past its limit is
		// killed, not slowed to a crawl swapping.
		err := need("memory",
			[]limitFile{{"memory.max", v, false}, {"memory.swap.max", "0", true}},
			[]limitFile{{"memory.limit_in_bytes", v, false}, {"memory.memsw.limit_in_bytes", v, true}})
		if err != nil {
			return err
		}
	}
	if n := l.PidsMax; n > 0 {
		v := strconv.Itoa(n)
		if err := need("pids", []limitFile{{"pids.max", v, false}}, []limitFile{{"pids.max", v, false}}); err != nil {
			return err
		}
	}
	if c := l.CPUMax; c > 0 {
		quota := strconv.FormatInt(max(int64(c*cpuPeriodUS), 1000), 10)
		period := strconv.Itoa(cpuPeriodUS)
		err := need("cpu",
			[]limitFile{{"cpu.max", quota + " " + period, false}},
			[]limitFile{{"cpu.cfs_period_us", period, false}, {"cpu.cfs_quota_us", quota, false}})
		if err != nil {
			return err
		}
	}
	ls.clearLeftovers()
	cc.limits = ls
	g, err := cc.New("limits-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		cc.limits = nil
		return err
	}
	g.Remove(time.Second)
	if cc.watch != nil { // no reuse: see above
		unix.Close(cc.watch.fd)
		cc.watch = nil
	}
	return nil
}

// Limited reports whether the calls' cgroups hold limits (nil: none).
func (cc *CallCgroups) Limited() bool { return cc != nil && cc.limits != nil }

// MemoryLimited reports whether the calls' cgroups, a zygote's among them,
// hold a memory limit (--call-memory-max; nil: none).
func (cc *CallCgroups) MemoryLimited() bool { return cc.Limited() && cc.limits.limits.MemoryMax > 0 }

// controllerEnabled reports whether the cgroups made in base get ctrl.
func controllerEnabled(base, ctrl string) bool {
	b, _ := os.ReadFile(filepath.Join(base, "cgroup.subtree_control"))
	return hasController(strings.ReplaceAll(strings.TrimSpace(string(b)), " ", ","), ctrl)
}

// ownV1Cgroups finds this process's cgroup in each v1 hierarchy of
// memory, pids and cpu that is mounted, by controller.
func ownV1Cgroups() map[string]string {
	own := map[string]string{}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return own
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		p := strings.SplitN(sc.Text(), ":", 3)
		if len(p) != 3 || p[0] == "0" {
			continue
		}
		for ctrl := range limitFlags {
			if !hasController(p[1], ctrl) {
				continue
			}
			for _, mount := range []string{filepath.Join("/sys/fs/cgroup", p[1]), filepath.Join("/sys/fs/cgroup", ctrl)} {
				var st unix.Statfs_t
				if unix.Statfs(mount, &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
					own[ctrl] = filepath.Join(mount, p[2])
					break
				}
			}
		}
	}
	return own
}

// clearLeftovers removes the calls' v1 cgroups of workers that are gone,
// and this worker's own from before a reload re-executed it: their
// processes were killed with their v2 cgroups.
func (ls *limitSet) clearLeftovers() {
	for _, v := range ls.v1 {
		dirs, _ := filepath.Glob(filepath.Join(v.parent, "fluksio-call-*"))
		for _, dir := range dirs {
			pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), "fluksio-call-"), "-")
			n, err := strconv.Atoi(pid)
			if err == nil && (n == os.Getpid() || syscall.Kill(n, 0) == syscall.ESRCH) {
				os.Remove(dir)
			}
		}
	}
}

// applyLimits sets the limits on g, just made as name, and makes its v1
// cgroups; nothing runs in it yet.
func (cc *CallCgroups) applyLimits(g *CallCgroup, name string) error {
	ls := cc.limits
	if ls == nil {
		return nil
	}
	g.limits = &callLimitCgroups{set: ls}
	for _, f := range ls.v2 {
		if err := writeLimit(g.dir, f); err != nil {
			return err
		}
	}
	for _, v := range ls.v1 {
		dir := filepath.Join(v.parent, ls.prefix+name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("making the call's cgroup v1 %s cgroup for %s: %w", v.ctrl, limitFlags[v.ctrl], err)
		}
		g.limits.v1 = append(g.limits.v1, dir)
		for _, f := range v.files {
			if err := writeLimit(dir, f); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeLimit(dir string, f limitFile) error {
	err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.value), 0)
	if err != nil && !f.optional {
		return fmt.Errorf("setting %s to %s in the call's cgroup %s: %w", f.name, f.value, dir, err)
	}
	return nil
}

// enterLimits puts pid, in g's v2 cgroup, into g's v1 cgroups.
func (g *CallCgroup) enterLimits(pid int) error {
	if g.limits == nil {
		return nil
	}
	for _, dir := range g.limits.v1 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("moving the runner into its cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// removeLimits removes g's v1 cgroups, its processes gone, waiting up to
// wait for the kernel to let go of them.
func (g *CallCgroup) removeLimits(wait time.Duration) error {
	if g.limits == nil {
		return nil
	}
	deadline := time.Now().Add(wait)
	for _, dir := range g.limits.v1 {
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// watchLimit makes w tell whether a kill was the call's own memory
// limit's: in cgroup v2 the call's memory.events counts the times its
// limit was reached (oom); in v1 the call's own memory cgroup counts the
// kill (oom_kill), and its usage reached its limit (memory.failcnt, which
// newer kernels no longer count, or the peak usage at the limit).
func (w *OOMWatch) watchLimit(g *CallCgroup) {
	if g == nil || g.limits == nil || g.limits.set.limits.MemoryMax <= 0 {
		return
	}
	ls := g.limits.set
	limit := ls.limits.MemoryMax
	for i, v := range ls.v1 {
		if v.ctrl != "memory" {
			continue
		}
		dir := g.limits.v1[i]
		kills := oomCounter{name: filepath.Join(dir, "memory.oom_control")}
		w.add(kills)
		killsBefore := kills.read()
		failBefore := readInt(filepath.Join(dir, "memory.failcnt"))
		w.limit = limit
		w.limitReached = func() bool {
			return kills.read() > killsBefore && (readInt(filepath.Join(dir, "memory.failcnt")) > failBefore ||
				readInt(filepath.Join(dir, "memory.max_usage_in_bytes")) >= limit)
		}
		return
	}
	events := filepath.Join(g.dir, "memory.events")
	before := keyedValue(events, "oom")
	w.limit = limit
	w.limitReached = func() bool { return keyedValue(events, "oom") > before }
}

func readInt(path string) int64 {
	b, _ := os.ReadFile(path)
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// CallLimit is the call's memory limit (--call-memory-max) when the OOM
// killer killed in its cgroup as it reached that limit, else 0: the call
// was killed for passing its own limit, not for the machine's memory.
func (w *OOMWatch) CallLimit() int64 {
	if w.limit <= 0 || !w.Killed() || !w.limitReached() {
		return 0
	}
	return w.limit
}
