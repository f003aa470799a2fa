package nspawn

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// Options shape one boot. The zero value is a good default.
type Options struct {
	// Name is the container's host name (default: fluksio-test-RANDOM).
	Name string
	// Log, if set, also receives the container's console as it is written.
	Log io.Writer
	// BootTimeout bounds the wait for systemd to finish booting
	// (default 2 minutes).
	BootTimeout time.Duration
	// Cgroup, if set, names a cgroup that the machines given the same name
	// share, as containers sharing a cgroup parent do (a test of just
	// that); by default each machine has one of its own.
	Cgroup string
}

// Machine is one booted container. Close it.
type Machine struct {
	Name string

	root    string // the container's / on the host (an overlay mount or a copy)
	work    string // temp dir holding root and, with overlay, its layers
	overlay bool
	cmd     *exec.Cmd
	done    chan struct{} // closed when systemd-nspawn has exited
	init    int           // host pid of the container's systemd
	console *enginetest.Buffer
	cgroups []string // the machine's cgroups on the host, one per hierarchy
	shared  bool     // they are shared with other machines (Options.Cgroup)

	closeOnce sync.Once
	closeErr  error
}

// Boot starts a fresh copy of the rootfs under systemd-nspawn and waits until
// systemd inside reports running (or degraded: a unit the test does not
// care about failing is not the test's problem, and Exec can ask).
func Boot(ctx context.Context, opts Options) (_ *Machine, err error) {
	base, err := Rootfs(ctx)
	if err != nil {
		return nil, err
	}
	if opts.Name == "" {
		b := make([]byte, 4)
		rand.Read(b)
		opts.Name = "fluksio-test-" + hex.EncodeToString(b)
	}
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 2 * time.Minute
	}
	work, err := os.MkdirTemp("", "fluksio-nspawn-")
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	m := &Machine{Name: opts.Name, work: work, root: filepath.Join(work, "root"), done: make(chan struct{}), console: &enginetest.Buffer{}}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	if err := m.copyRoot(ctx, base); err != nil {
		return nil, err
	}
	// debootstrap copied the host's /etc/hostname, and systemd would set
	// that over the name nspawn gives the container.
	if err := os.WriteFile(filepath.Join(m.root, "etc/hostname"), []byte(opts.Name+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}

	// --register=no and --keep-unit: no machined and no scope of our own,
	// so it works where the host's init is not systemd (a CI container).
	// The container's cgroup is then the one nspawn starts in: a cgroup of
	// its own (machineCgroups), which a shell moves itself into before it
	// becomes nspawn. Machines booted from one cgroup would share one
	// tree (system.slice/…), and each one's systemd and services would
	// meddle with the other's.
	// No --private-network: the container shares the host's loopback.
	cgroup := opts.Name
	if opts.Cgroup != "" {
		cgroup, m.shared = "shared-"+opts.Cgroup, true
	}
	if m.cgroups, err = machineCgroups(cgroup, m.shared); err != nil {
		return nil, err
	}
	m.cmd = exec.Command("/bin/sh", "-c", `for d; do [ "$d" = -- ] && break; echo $$ > "$d/cgroup.procs" || exit 125; shift; done; shift; exec "$@"`,
		"sh")
	m.cmd.Args = append(append(m.cmd.Args, m.cgroups...), "--", "systemd-nspawn", "-D", m.root, "--machine="+opts.Name,
		"--register=no", "--keep-unit", "--boot", "--console=pipe")
	// A pipe nobody writes keeps the console's stdin open for the whole
	// boot; /dev/null would hand the container an immediate EOF.
	stdin, err := m.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	var out io.Writer = m.console
	if opts.Log != nil {
		out = io.MultiWriter(m.console, opts.Log)
	}
	m.cmd.Stdout, m.cmd.Stderr = out, out
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	m.cmd.WaitDelay = 5 * time.Second
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("systemd-nspawn: %w", err)
	}
	go func() {
		m.cmd.Wait()
		stdin.Close()
		close(m.done)
	}()

	if err := m.waitBooted(ctx, opts.BootTimeout); err != nil {
		return nil, fmt.Errorf("booting %s: %w\nconsole:\n%s", opts.Name, err, tail(m.Console(), 6000))
	}
	return m, nil
}

// copyRoot gives the machine its own writable /: an overlay on the cached
// tree where the kernel allows it (instant, and the cache stays untouched),
// else a full copy.
func (m *Machine) copyRoot(ctx context.Context, base string) error {
	upper, wk := filepath.Join(m.work, "upper"), filepath.Join(m.work, "overlay-work")
	for _, d := range []string{m.root, upper, wk} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("boot: %w", err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", base, upper, wk)
	if out, err := exec.CommandContext(ctx, "mount", "-t", "overlay", "overlay", "-o", opts, m.root).CombinedOutput(); err == nil {
		m.overlay = true
		return nil
	} else if ctx.Err() != nil {
		return fmt.Errorf("boot: mount overlay: %w: %s", err, out)
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", base+"/.", m.root).CombinedOutput(); err != nil {
		return fmt.Errorf("boot: copying the rootfs: %w: %s", err, out)
	}
	return nil
}

func (m *Machine) waitBooted(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		select {
		case <-m.done:
			return fmt.Errorf("systemd-nspawn exited: %v", m.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("systemd did not finish booting (last state %q): %w", last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if m.init == 0 {
			m.init = findInit(m.cmd.Process.Pid)
			continue
		}
		// --wait blocks until the boot is over; before systemd listens it
		// answers "offline" at once, so ask again.
		out, _ := m.Exec(ctx, "systemctl is-system-running --wait")
		last = strings.TrimSpace(out)
		if last == "running" || last == "degraded" {
			return nil
		}
	}
}

// findInit returns the host pid of the container's pid 1: a descendant of
// systemd-nspawn that is pid 1 in its own pid namespace. 0: not yet.
func findInit(nspawn int) int {
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	var candidates []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "PPid:":
				parent[pid], _ = strconv.Atoi(f[1])
			case len(f) > 2 && f[0] == "NSpid:" && f[len(f)-1] == "1":
				candidates = append(candidates, pid)
			}
		}
	}
	for _, c := range candidates {
		for p := parent[c]; p > 1; p = parent[p] {
			if p == nspawn {
				return c
			}
		}
	}
	return 0
}

// Exec runs script with /bin/sh -c inside the container, as root, in a clean
// environment, and returns its stdout and stderr together. A non-zero exit
// is an error that carries the output too.
func (m *Machine) Exec(ctx context.Context, script string) (string, error) {
	if m.init == 0 {
		return "", errors.New("the container has no init process")
	}
	cmd := exec.CommandContext(ctx, "nsenter", "--target", strconv.Itoa(m.init),
		"--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd",
		"--", "/usr/bin/env", "-i",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LANG=C.UTF-8", "TERM=dumb", "DEBIAN_FRONTEND=noninteractive",
		"/bin/sh", "-c", script)
	// A daemon the script starts may keep the output pipe; do not wait for
	// it forever once the shell is gone.
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("in %s: %q: %w\n%s", m.Name, script, err, tail(out.String(), 4000))
	}
	return out.String(), nil
}

// CopyIn copies a host file into the container (mode kept, parents created).
func (m *Machine) CopyIn(hostPath, containerPath string) error {
	src, err := os.Open(hostPath)
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	dst := m.Path(containerPath)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return fmt.Errorf("copy in %s: %w", containerPath, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("copy in %s: %w", containerPath, err)
	}
	return os.Chmod(dst, st.Mode().Perm())
}

// Path is where a container path lies on the host while the machine runs,
// through /proc/PID/root of its init, so the container's own mounts (the
// tmpfs on /tmp, /run) are seen as it sees them. Absolute symlinks inside
// resolve against the host: read files, not links.
func (m *Machine) Path(containerPath string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", m.init), filepath.Clean("/"+containerPath))
}

// Console is everything the container has written to its console so far.
func (m *Machine) Console() string { return m.console.String() }

// Close powers the container off (kills it after 30 s), and removes its copy
// of the rootfs. Safe to call twice.
func (m *Machine) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

func (m *Machine) close() error {
	var errs []error
	if m.cmd != nil && m.cmd.Process != nil {
		// systemd-nspawn turns SIGTERM into an orderly poweroff of a
		// booted container.
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
			errs = append(errs, fmt.Errorf("%s did not power off in 30 s; killed", m.Name))
			syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			if m.init != 0 {
				syscall.Kill(m.init, syscall.SIGKILL)
			}
			<-m.done
		}
	}
	for _, cg := range m.cgroups {
		if m.shared {
			removeSharedCgroup(cg)
		} else if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	if m.overlay {
		if out, err := exec.Command("umount", m.root).CombinedOutput(); err != nil {
			// Lazily, so the temp dir below can still go.
			exec.Command("umount", "-l", m.root).Run()
			errs = append(errs, fmt.Errorf("umount %s: %w: %s", m.root, err, out))
		}
	}
	if m.work != "" {
		if err := os.RemoveAll(m.work); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
