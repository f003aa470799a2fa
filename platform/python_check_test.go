package platform

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A program that exits 0 without running the version script is not a
// Python: every call would fail later, so the check refuses it now.
func TestFindPythonRefusesAProgramThatIsNotPython(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"silent", "exit 0\n"},                        // /bin/true
		{"echo", "echo \"$@\"\n"},                     // prints its arguments
		{"wrong-version", "echo 'Python 3.11.2'\n"},   // not the script's output
		{"two-numbers", "echo 3.11\n"},                // not major.minor.micro
		{"signs", "echo 3.-1.0\n"},                    // not numbers
		{"extra", "echo 3.11.0; echo 3.11.0 again\n"}, // more than the version
	} {
		py := writeScript(t, t.TempDir(), "python", tc.body)
		path, _, err := FindPython(context.Background(), py)
		if path != "" {
			t.Errorf("%s: accepted as %q", tc.name, path)
		}
		wantErrorSaying(t, err, py, "--python")
	}
	if _, err := os.Stat("/bin/true"); err == nil {
		_, _, err := FindPython(context.Background(), "/bin/true")
		wantErrorSaying(t, err, "/bin/true", "does not behave as Python", "--python")
	}
}

func TestFindPythonAcceptsNewerThan38(t *testing.T) {
	for _, v := range []string{"3.8.0", "3.13.1", "4.0.0"} {
		py := writeScript(t, t.TempDir(), "python", "echo "+v+"\n")
		if _, version, err := FindPython(context.Background(), py); err != nil || version != v {
			t.Errorf("Python %s: version %q, error %v", v, version, err)
		}
	}
	py := writeScript(t, t.TempDir(), "python", "echo 3.7.9\n") // says it is too old, exits 0
	_, _, err := FindPython(context.Background(), py)
	wantErrorSaying(t, err, "3.7.9", "3.8 or newer")
}

// A --python that hangs is killed on the check's timeout together with
// what it started, and the error says it timed out.
func TestPythonCheckTimeoutKillsTheWholeGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	py := writeScript(t, dir, "python", "sleep 300 &\necho $! > "+pidFile+"\nwait\n")
	start := time.Now()
	_, err := checkPython(context.Background(), py, 1*time.Second)
	wantErrorSaying(t, err, py, "timed out", "--python")
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the check took %s with a 1 s timeout", took)
	}
	b, rerr := os.ReadFile(pidFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if child <= 0 {
		t.Fatalf("bad child pid %q", b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ProcessAlive(child) {
		if time.Now().After(deadline) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("the hanging script's child %d was left running", child)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The version check runs in a process group of its own, like a runner:
// orphans reaped meanwhile (a call of this worker ending) must not take
// its exit from os/exec, which would then fail with "no child processes".
func TestPythonCheckSurvivesOrphansBeingReaped(t *testing.T) {
	py := writeScript(t, t.TempDir(), "python", "echo 3.11.2\n")
	stop := make(chan struct{})
	reaping := make(chan struct{})
	go func() {
		defer close(reaping)
		for {
			select {
			case <-stop:
				return
			default:
				ReapOrphans()
			}
		}
	}()
	defer func() { close(stop); <-reaping }()
	for i := 0; i < 400; i++ { // the old code failed within 100 to 200
		if _, err := checkPython(context.Background(), py, 10*time.Second); err != nil {
			t.Fatalf("check %d with orphans being reaped: %v", i, err)
		}
	}
}
