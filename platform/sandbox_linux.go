package platform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SandboxCommand makes cmd start through the sandbox: the worker's binary
// exe, in new user, mount and PID namespaces, with the capability to
// mount in them only (an ambient capability, kept across the helper's
// exec), lays out spec and executes cmd's program in cmd's place.
// Everything else of cmd (environment, descriptors, process group, cgroup)
// is kept. The user namespace maps the worker's own uid and gid to
// themselves: files keep their owners, and node code is who it was.
func SandboxCommand(cmd *exec.Cmd, exe string, spec SandboxSpec) error {
	if spec.Dir == "" {
		spec.Dir = cmd.Dir
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	program := cmd.Path
	cmd.Args = append([]string{exe, SandboxExecArg, program}, cmd.Args[1:]...)
	cmd.Path = exe
	cmd.Env = append(slices.Clip(cmd.Env), SandboxSpecEnv+"="+string(js))
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	a := cmd.SysProcAttr
	a.Cloneflags |= unix.CLONE_NEWUSER | unix.CLONE_NEWNS
	if spec.OwnPIDs {
		a.Cloneflags |= unix.CLONE_NEWPID
	}
	uid, gid := os.Getuid(), os.Getgid()
	a.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
	a.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
	a.GidMappingsEnableSetgroups = false
	a.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SETPCAP} // to mount; to empty the bounding set
	return nil
}

// ProbeSandbox tries the sandbox once, as a runner's would be made, and
// says why it cannot be had ("" when it can; what it lacks, where it
// lacks something, in note): user namespaces off
// (kernel.unprivileged_userns_clone, user.max_user_namespaces), a
// seccomp or unit setting refusing them or mount (systemd's
// RestrictNamespaces, SystemCallFilter=~@mount), a kernel before 5.12
// (mount_setattr).
func ProbeSandbox(exe, stateDir string) (why, note string) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Path = exe
	cmd.Args = []string{exe}
	cmd.Dir = "/"
	cmd.Env = []string{}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	spec := SandboxSpec{Hide: []string{stateDir}, Dir: "/", Probe: true, OwnPIDs: !SandboxScopes()}
	if err := SandboxCommand(cmd, exe, spec); err != nil {
		return err.Error(), ""
	}
	err := cmd.Run()
	if err == nil {
		return "", strings.TrimSpace(stdout.String())
	}
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		return strings.TrimPrefix(msg, "fluksio-worker sandbox: "), ""
	}
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EINVAL) {
		return "the kernel refused new user namespaces (" + err.Error() + "): user namespaces are off or limited (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, or a seccomp/systemd RestrictNamespaces= setting)", ""
	}
	return err.Error(), ""
}

// The helper is dispatched before anything else of the program runs, in
// whatever binary the worker is (the release's, or a test binary that
// starts workers in-process), so that no caller has to remember to.
func init() {
	if len(os.Args) > 1 && os.Args[1] == SandboxExecArg {
		SandboxExec()
	}
}

// SandboxExec is the helper: it runs in the runner's new namespaces, lays
// out the spec from the environment, drops every capability and executes
// the runner (os.Args[2:]). It never returns: a failure is said on stderr
// and ends the process with SandboxExitSetup.
func SandboxExec() {
	// Capabilities are a thread's: the one dropping them is the one that
	// executes the runner.
	runtime.LockOSThread()
	var spec SandboxSpec
	env := os.Environ()
	if i := slices.IndexFunc(env, func(e string) bool { return strings.HasPrefix(e, SandboxSpecEnv+"=") }); i >= 0 {
		if err := json.Unmarshal([]byte(env[i][len(SandboxSpecEnv)+1:]), &spec); err != nil {
			sandboxFail("reading its spec: %v", err)
		}
		env = slices.Delete(env, i, i+1)
	} else {
		sandboxFail("no spec (%s) in the environment", SandboxSpecEnv)
	}
	if err := layOut(spec); err != nil {
		sandboxFail("%v", err)
	}
	var keep []uintptr
	if spec.Zygote {
		// Its forks each make a mount namespace of their own, and then
		// drop these too, before any node code runs (sandbox_fork).
		keep = zygoteCaps
	}
	if err := dropCapabilities(keep); err != nil {
		sandboxFail("dropping capabilities: %v", err)
	}
	if !spec.OwnPIDs && !spec.Zygote {
		if err := landlockScope(); err != nil {
			sandboxFail("keeping it from signalling the worker: Landlock's scopes (Linux 6.12): %v", err)
		}
	}
	if spec.Probe {
		os.Exit(0)
	}
	if len(os.Args) < 3 {
		sandboxFail("no program to run")
	}
	program := os.Args[2]
	args := append([]string{program}, os.Args[3:]...)
	err := unix.Exec(program, args, env)
	sandboxFail("executing %s: %v", program, err)
}

func sandboxFail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fluksio-worker sandbox: "+format+"\n", args...)
	os.Exit(SandboxExitSetup)
}

// layOut makes the mounts of spec, in this process's new mount namespace.
func layOut(spec SandboxSpec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	// Each path shown is opened before anything hides it.
	type shown struct {
		SandboxBind
		fd int
	}
	var binds []shown
	for _, b := range spec.Binds {
		fd, err := unix.Open(b.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("showing %s: %w", b.Path, err)
		}
		binds = append(binds, shown{b, fd})
	}
	defer func() {
		for _, b := range binds {
			unix.Close(b.fd)
		}
	}()
	// Everything read-only, recursively (mount_setattr, Linux 5.12).
	if err := setAttr("/", true, unix.MOUNT_ATTR_RDONLY, 0); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return errors.New("the kernel is older than 5.12 (no mount_setattr); a sandbox needs Linux 5.12 or later")
		}
		return fmt.Errorf("making the file system read-only: %w", err)
	}
	// The private temporary directories first: what is shown inside them
	// (a state directory under /tmp) is then bound into the new ones.
	for _, t := range []string{"/tmp", "/var/tmp"} {
		if st, err := os.Stat(t); err != nil || !st.IsDir() {
			continue
		}
		if err := unix.Mount("tmpfs", t, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("giving the call a private %s: %w", t, err)
		}
	}
	var hidden []string
	for _, h := range spec.Hide {
		st, err := os.Lstat(h)
		if err != nil {
			continue // nothing to hide
		}
		if st.IsDir() {
			if err := unix.Mount("tmpfs", h, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
				return fmt.Errorf("hiding %s: %w", h, err)
			}
			hidden = append(hidden, h)
		} else if err := unix.Mount("/dev/null", h, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("hiding %s: %w", h, err)
		} else if err := setAttr(h, false, unix.MOUNT_ATTR_RDONLY, 0); err != nil {
			return fmt.Errorf("hiding %s: %w", h, err)
		}
	}
	for _, b := range binds {
		if err := mountPoint(b.Path, b.fd); err != nil {
			return fmt.Errorf("showing %s: %w", b.Path, err)
		}
		if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(b.fd), b.Path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("showing %s: %w", b.Path, err)
		}
		set, clr := uint64(unix.MOUNT_ATTR_RDONLY), uint64(0)
		if b.Write {
			set, clr = 0, unix.MOUNT_ATTR_RDONLY
		}
		if err := setAttr(b.Path, false, set, clr); err != nil {
			return fmt.Errorf("showing %s %s: %w", b.Path, map[bool]string{true: "writable", false: "read-only"}[b.Write], err)
		}
	}
	for _, h := range hidden {
		if err := setAttr(h, false, unix.MOUNT_ATTR_RDONLY, 0); err != nil {
			return fmt.Errorf("hiding %s: %w", h, err)
		}
	}
	if err := ownDev(); err != nil {
		return fmt.Errorf("giving the call a /dev of its own: %w", err)
	}
	// A /proc of the PID namespace's own. The kernel refuses one where
	// parts of the /proc seen are covered (systemd's ProtectKernelTunables
	// does): then the worker's /proc stays, said by the probe, and pids
	// there name no process of this namespace.
	if !spec.OwnPIDs {
		// No PID namespace of its own, so no /proc of its own either: the
		// worker's, writable again where a process writes its own
		// settings (/proc/self/uid_map, for a zygote's forks).
		if err := setAttr("/proc", false, 0, unix.MOUNT_ATTR_RDONLY); err != nil {
			return fmt.Errorf("/proc: %w", err)
		}
	} else if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		if spec.Probe {
			fmt.Printf("without a /proc of its own (%v: parts of /proc are covered, as systemd's ProtectKernelTunables does), node code can read the /proc of the worker's processes\n", err)
		}
	}
	// The kernel's settings stay read-only (as container runtimes keep
	// them): a worker run as root runs node code as uid 0 without a
	// capability, and a few of them check the uid alone.
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"} {
		if unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, "") == nil {
			setAttr(p, true, unix.MOUNT_ATTR_RDONLY, 0)
		}
	}
	if spec.Dir != "" {
		if err := unix.Chdir(spec.Dir); err != nil {
			return fmt.Errorf("entering %s: %w", spec.Dir, err)
		}
	}
	return nil
}

// mountPoint makes sure path can be mounted on, as what fd is: a
// directory or an empty file, made inside a hidden directory where it is
// missing.
func mountPoint(path string, fd int) error {
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return os.Mkdir(path, 0o755)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	return f.Close()
}

// setAttr sets and clears mount attributes of the mount at path (and of
// every mount below it where recursive).
func setAttr(path string, recursive bool, set, clr uint64) error {
	flags := uint(0)
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	return unix.MountSetattr(unix.AT_FDCWD, path, flags, &unix.MountAttr{Attr_set: set, Attr_clr: clr})
}

// devices are the character devices every /dev has; gpuDevices, those of
// the GPUs (NVIDIA, and DRM and ROCm's for others), shown where present.
var (
	devices    = []string{"null", "zero", "full", "random", "urandom", "tty"}
	gpuDevices = []string{"nvidia*", "nvidia-caps", "dri", "kfd"}
)

// ownDev mounts a /dev of the runner's own: a tmpfs with the usual
// devices and the GPUs', bound from the real one, a pseudo-terminal
// instance of its own and a private /dev/shm. Disks and every other
// device stay out of reach. It is made in the new /tmp and moved.
func ownDev() error {
	stage, err := os.MkdirTemp("/tmp", ".dev-")
	if err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	bind := func(name string) error {
		src := filepath.Join("/dev", name)
		st, err := os.Lstat(src)
		if err != nil {
			return nil // not on this machine
		}
		dst := filepath.Join(stage, name)
		if st.IsDir() {
			err = os.Mkdir(dst, 0o755)
		} else {
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o666); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return err
		}
		return unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, "")
	}
	for _, d := range devices {
		if err := bind(d); err != nil {
			return fmt.Errorf("/dev/%s: %w", d, err)
		}
	}
	for _, pattern := range gpuDevices {
		names, _ := filepath.Glob(filepath.Join("/dev", pattern))
		for _, n := range names {
			if err := bind(filepath.Base(n)); err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(stage, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", filepath.Join(stage, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err == nil {
		os.Symlink("pts/ptmx", filepath.Join(stage, "ptmx"))
	}
	if err := unix.Mount("tmpfs", filepath.Join(stage, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	for link, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		os.Symlink(target, filepath.Join(stage, link))
	}
	if err := unix.Mount(stage, "/dev", "", unix.MS_MOVE, ""); err != nil {
		return err
	}
	return os.Remove(stage)
}

// zygoteCaps are what a zygote keeps, in its own namespaces only: what a
// fork needs to make a mount namespace of its own and lay it out, and to
// empty its bounding set after.
var zygoteCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SETPCAP}

// dropCapabilities leaves this thread no capability but keep (in its own
// namespaces: kept across the exec as ambient ones), none to gain back
// (the bounding set emptied of the rest, no_new_privs), so that the
// process it executes has none but those, whatever its uid.
func dropCapabilities(keep []uintptr) error {
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if slices.Contains(keep, uintptr(c)) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return err
		}
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_LOWER, uintptr(c), 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for _, c := range keep {
		bit := uint32(1) << (c % 32)
		data[c/32].Effective |= bit
		data[c/32].Permitted |= bit
		data[c/32].Inheritable |= bit
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return err
	}
	for _, c := range keep {
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

// Landlock's scopes (ABI 6, Linux 6.12): a process restricted with them
// signals nothing, and connects to no abstract socket, outside its own
// domain; ptrace outside it Landlock refuses at every ABI.
const (
	landlockScopeAbstractUnixSocket = 1 << 0
	landlockScopeSignal             = 1 << 1
	landlockCreateRulesetVersion    = 1 << 0
)

// SandboxScopes reports whether the kernel has Landlock's scopes, which
// keep a sandboxed process from signalling or tracing what is outside it
// without a PID namespace: then runners keep their real pids, and runners
// forked from a zygote can be sandboxed (each makes user and mount
// namespaces of its own; a fork cannot be given a PID namespace, its pid
// must stay the worker's to watch). Where it cannot, each runner gets a
// PID namespace, and spares are started, not forked.
func SandboxScopes() bool {
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, landlockCreateRulesetVersion)
	return errno == 0 && abi >= 6
}

// landlockScope restricts this process to signal, trace and connect to
// abstract sockets only within its own domain (Landlock's scopes).
func landlockScope() error {
	attr := [3]uint64{0, 0, landlockScopeSignal | landlockScopeAbstractUnixSocket}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr[0])), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return errno
	}
	defer unix.Close(int(fd))
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
