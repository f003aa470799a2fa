package agent

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// checkConfig runs check-config with run's options and returns its exit
// code and what it wrote.
func checkConfig(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := CheckConfigCommand(context.Background(), args, &out, &out)
	return code, out.String()
}

// checkArgs are options check-config accepts, with python as --python.
func checkArgs(t *testing.T, python string, more ...string) []string {
	t.Setenv("FLUKSIO_WORKER_TOKEN", "fw_0123456789abcdef0123456789abcdef")
	return append([]string{"--url", "ws://127.0.0.1:1/api/v1/workers/attach", "--python", python, "--state-dir", t.TempDir()}, more...)
}

func systemPython(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 here")
	}
	return python
}

// check-config tries the --listen address: one another program holds
// fails it, saying what to do, unless it is the one the reloading worker
// serves itself, or (run by hand) the worker of the same state directory:
// a reload frees it for the new process.
func TestCheckConfigTriesTheListenAddress(t *testing.T) {
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	python := systemPython(t)

	code, out := checkConfig(t, checkArgs(t, python, "--listen", addr)...)
	if code != 2 || !strings.Contains(out, "address already in use") || !strings.Contains(out, "choose another --listen") {
		t.Errorf("check-config with --listen on a taken port: exit %d, %q; want 2 saying it is taken and what to do", code, out)
	}

	t.Setenv(envReloadListen, addr)
	if code, out := checkConfig(t, checkArgs(t, python, "--listen", addr)...); code != 0 {
		t.Errorf("check-config with the reloading worker's own --listen: exit %d, %q", code, out)
	}
	t.Setenv(envReloadListen, "")

	// By hand beside the worker that serves it, from the same state
	// directory: that worker's reload frees it.
	stateDir := t.TempDir()
	lock, err := config.LockStateDir(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	st := status.NewFile(stateDir, status.Status{PID: os.Getpid(), Listen: addr}, logging.NewRedactor(""), func(err error) { t.Error(err) })
	st.Flush()
	if code, out := checkConfig(t, checkArgs(t, python, "--listen", addr, "--state-dir", stateDir)...); code != 0 || !strings.Contains(out, "held by the worker running from this state directory") {
		t.Errorf("check-config beside the worker serving its --listen: exit %d, %q; want 0 with a note", code, out)
	}
	// From another state directory, that worker is another program.
	if code, _ := checkConfig(t, checkArgs(t, python, "--listen", addr)...); code != 2 {
		t.Errorf("check-config with a port the worker of another state directory holds: exit %d; want 2", code)
	}

	taken.Close()
	if code, out := checkConfig(t, checkArgs(t, python, "--listen", addr)...); code != 0 {
		t.Errorf("check-config with --listen on a free port: exit %d, %q", code, out)
	}
}

// check-config runs the Python it would use: one that is not there, or is
// not a Python, fails it.
func TestCheckConfigChecksPython(t *testing.T) {
	if code, out := checkConfig(t, checkArgs(t, systemPython(t))...); code != 0 {
		t.Fatalf("check-config with python3: exit %d, %q", code, out)
	}
	missing := filepath.Join(t.TempDir(), "python3")
	code, out := checkConfig(t, checkArgs(t, missing)...)
	if code != 2 || !strings.Contains(out, missing) {
		t.Errorf("check-config with --python %s (absent): exit %d, %q; want 2 naming it", missing, code, out)
	}
	code, out = checkConfig(t, checkArgs(t, "/bin/false")...)
	if code != 2 {
		t.Errorf("check-config with --python /bin/false: exit %d, %q; want 2", code, out)
	}
}

// A hook script saved without its run bit would decline every call: a
// reload to it is refused, saying chmod +x, and the worker keeps serving.
func TestCheckConfigRefusesAHookThatCannotRun(t *testing.T) {
	script := filepath.Join(t.TempDir(), "gpu-free.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o644)
	code, out := checkConfig(t, checkArgs(t, systemPython(t), "--pre-call-hook", script)...)
	if code != config.ExitUsage || !strings.Contains(out, "chmod +x "+script) {
		t.Errorf("check-config with a hook without its run bit: exit %d, %q; want 2 and chmod +x", code, out)
	}
}
