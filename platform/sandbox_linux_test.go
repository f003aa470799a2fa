package platform

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The test binary is the sandbox's helper as the worker's binary is
// (platform's init).

// sandboxed runs script under sh in a sandbox of spec; it fails the test
// where the kernel gives none.
func sandboxed(t *testing.T, spec SandboxSpec, script string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if why, _ := ProbeSandbox(exe, t.TempDir()); why != "" {
		t.Skip("no sandbox here: " + why)
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := SandboxCommand(cmd, exe, spec); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxed script: %v\n%s", err, out.String())
	}
	return out.String()
}

// TestSandboxShowsOnlyWhatIsTheCalls: from inside, the state directory
// and the token are empty, a sibling call's directory is gone, the call's
// own directory and /tmp take files, the rest is read-only, the worker's
// pid names no process, and the spec is not in the runner's environment.
func TestSandboxShowsOnlyWhatIsTheCalls(t *testing.T) {
	t.Run("own-pids", func(t *testing.T) { testSandboxShows(t, true) })
	t.Run("scoped", func(t *testing.T) {
		if !SandboxScopes() {
			t.Skip("no Landlock scopes here (Linux 6.12)")
		}
		testSandboxShows(t, false)
	})
}

func testSandboxShows(t *testing.T, ownPIDs bool) {
	state := t.TempDir()
	own := filepath.Join(state, "calls", "call-own")
	sibling := filepath.Join(state, "calls", "call-other")
	for _, d := range []string{own, sibling} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(sibling, "secret"), []byte("neighbour"), 0o600)
	os.WriteFile(filepath.Join(state, "held"), []byte("journal"), 0o600)
	runtimeFile := filepath.Join(state, "runtime", "worker_main.py")
	os.MkdirAll(filepath.Dir(runtimeFile), 0o700)
	os.WriteFile(runtimeFile, []byte("print('runtime')\n"), 0o600)
	// Outside /tmp, which the sandbox replaces whole: a file hidden by
	// its own mount, as /etc/fluksio-worker/config.toml is.
	tokenDir, err := os.MkdirTemp(".", ".sandbox-token-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tokenDir) })
	token, _ := filepath.Abs(filepath.Join(tokenDir, "token"))
	os.WriteFile(token, []byte("s3cr3t-token"), 0o600)
	writable := t.TempDir()

	spec := SandboxSpec{
		Hide: []string{state, token},
		Binds: []SandboxBind{
			{Path: own, Write: true},
			{Path: runtimeFile},
			{Path: writable, Write: true},
		},
		Dir:     own,
		OwnPIDs: ownPIDs,
	}
	script := strings.Join([]string{
		`echo "cwd=$(pwd)"`,
		`echo "token=$(cat ` + token + ` 2>&1)"`,
		`ls -A ` + filepath.Join(state, "calls") + ` | sed 's/^/listed=/'`,
		`cat ` + filepath.Join(sibling, "secret") + ` >/dev/null 2>&1 || echo sibling=unreadable`,
		`cat ` + filepath.Join(state, "held") + ` >/dev/null 2>&1 || echo held=unreadable`,
		`echo mine > ` + filepath.Join(own, "out") + ` && echo own=writable`,
		`echo planted >> ` + runtimeFile + ` 2>/dev/null || echo runtime=read-only`,
		`cat ` + runtimeFile + ` | sed 's/^/runtime-says=/'`,
		`echo x > ` + filepath.Join(writable, "x") + ` && echo bind=writable`,
		`echo x > /tmp/left && echo tmp=writable`,
		`echo x > /dev/shm/left && echo shm=writable`,
		`touch /etc/planted 2>/dev/null || echo etc=read-only`,
		`kill -0 ` + strconv.Itoa(os.Getpid()) + ` 2>/dev/null || echo worker=unsignalled`,
		`echo "pid=$$"`,
		`env | grep -c ` + SandboxSpecEnv + ` | sed 's/^/spec-in-env=/'`,
		`ls /dev | grep -c '^sd\|^vd\|^nvme\|^loop' | sed 's/^/disks=/'`,
	}, "\n")
	out := sandboxed(t, spec, script)
	for _, want := range []string{
		"cwd=" + own, "token=\n", "listed=call-own\n", "sibling=unreadable", "held=unreadable",
		"own=writable", "runtime=read-only", "runtime-says=print('runtime')", "bind=writable",
		"tmp=writable", "shm=writable", "etc=read-only", "worker=unsignalled",
		"spec-in-env=0", "disks=0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the sandbox, want %q in:\n%s", want, out)
		}
	}
	if ownPIDs != strings.Contains(out, "pid=1\n") {
		t.Errorf("a PID namespace of its own: %v; the script's pid:\n%s", ownPIDs, out)
	}
	if strings.Contains(out, "s3cr3t-token") {
		t.Errorf("the token was read:\n%s", out)
	}
	if strings.Contains(out, "listed=call-other") {
		t.Errorf("a sibling call's directory is listed:\n%s", out)
	}
	// What the call wrote in its own directory is there after; /tmp's and
	// /dev/shm's files went with the sandbox.
	if b, err := os.ReadFile(filepath.Join(own, "out")); err != nil || string(b) != "mine\n" {
		t.Errorf("the call's own file: %q, %v", b, err)
	}
	for _, p := range []string{"/tmp/left", "/dev/shm/left"} {
		if _, err := os.Stat(p); err == nil {
			os.Remove(p)
			t.Errorf("%s outlived the sandbox", p)
		}
	}
	if b, _ := os.ReadFile(runtimeFile); string(b) != "print('runtime')\n" {
		t.Errorf("the runtime was rewritten: %q", b)
	}
}

// TestSandboxCannotWriteItsCgroup: node code cannot lift its own limits
// nor leave its cgroup: /sys is read-only, and no capability undoes it.
func TestSandboxCannotWriteItsCgroup(t *testing.T) {
	out := sandboxed(t, SandboxSpec{Dir: "/"}, strings.Join([]string{
		`for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/unified/cgroup.procs /sys/fs/cgroup/cgroup.procs; do [ -e $f ] && { echo -1 > $f 2>/dev/null && echo "wrote=$f" || echo "refused=$f"; }; done`,
		`mount -o remount,rw /sys/fs/cgroup 2>/dev/null && echo remounted || echo remount=refused`,
		`umount /tmp 2>/dev/null && echo unmounted || echo umount=refused`,
		`grep ^CapEff /proc/self/status`,
	}, "\n"))
	if strings.Contains(out, "wrote=") || strings.Contains(out, "remounted") || strings.Contains(out, "unmounted") {
		t.Errorf("the sandbox let node code change its limits or mounts:\n%s", out)
	}
	if !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("node code kept capabilities:\n%s", out)
	}
}
