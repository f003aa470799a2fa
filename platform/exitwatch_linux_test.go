package platform

import (
	"bufio"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The kernel's word that a process exited comes before anyone reaps it:
// a zygote's runner is known dead while its zygote has not reported it.
func TestExitWatchSaysAProcessExitedBeforeItIsReaped(t *testing.T) {
	t.Parallel()
	cmd := startSleeper(t)
	w := WatchExit(cmd.Process.Pid)
	defer w.Close()
	if w.Exited() == nil {
		t.Skip("no pidfd here (Linux 5.3, or a seccomp filter denies it)")
	}
	if w.HasExited() {
		t.Fatal("a running process is said to have exited")
	}
	cmd.Process.Kill()
	select {
	case <-w.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("Exited did not close within 30 s of a SIGKILL")
	}
	if !w.HasExited() {
		t.Error("HasExited is false once Exited closed")
	}
	if ProcessAlive(cmd.Process.Pid) {
		t.Error("Exited closed while the process still runs")
	}
}

// A process its former parent reaped cannot be waited for: its status is
// lost, and the watch says so rather than wait for whatever process
// takes its pid.
func TestWaitAdoptedOfAProcessReapedByAnother(t *testing.T) {
	t.Parallel()
	sh := exec.Command("sh", "-c", "sleep 1 & echo $!; wait")
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Skipf("cannot start sh: %v", err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("sh printed %q", line)
	}
	w := WatchExit(pid)
	defer w.Close()
	if err := sh.Wait(); err != nil { // sh reaped its child first
		t.Fatal(err)
	}
	if _, _, err := w.WaitAdopted(); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("WaitAdopted of a process its parent reaped: %v; want ECHILD", err)
	}
}
