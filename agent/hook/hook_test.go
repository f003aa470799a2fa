//go:build linux

package hook

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/fluksio-worker/platform"
)

func TestHookAcceptsAndDeclines(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "stdin")
	t.Setenv("FLUKSIO_WORKER_TOKEN", "secret-token")
	r := Run(context.Background(), `cat > `+got+`; test -z "$FLUKSIO_WORKER_TOKEN" || { echo token seen >&2; exit 1; }`, []byte(`{"call_id":"c1"}`), nil, time.Minute)
	if !r.OK() {
		t.Fatalf("a hook that exits 0: %+v", r)
	}
	// One line, ending with a newline: appended, it stays one record.
	if b, _ := os.ReadFile(got); string(b) != "{\"call_id\":\"c1\"}\n" {
		t.Errorf("the hook read %q", b)
	}
	r = Run(context.Background(), "echo; echo '  the GPU is busy  ' >&2; echo second >&2; exit 3", nil, nil, time.Minute)
	if r.OK() || r.Exit != 3 || r.Reason != "the GPU is busy" || r.Stderr != "the GPU is busy  \nsecond" {
		t.Errorf("a hook that exits 3: %+v", r)
	}
	// What a hook that exits 0 said is kept too, to be logged.
	r = Run(context.Background(), "echo 'nvidia-smi: not found' >&2", nil, nil, time.Minute)
	if !r.OK() || r.Stderr != "nvidia-smi: not found" {
		t.Errorf("a hook that exits 0 with a word on stderr: %+v", r)
	}
}

// TestHookThatHangsIsKilled: a hook past its bound is killed with
// everything it started, even a child that holds its stderr open.
func TestHookThatHangsIsKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	began := time.Now()
	// The bound leaves a loaded machine time to start the shell and its child.
	r := Run(context.Background(), "sleep 600 & echo $! > "+pidFile+"; wait", nil, nil, 2*time.Second)
	if r.OK() || !r.TimedOut || !strings.Contains(r.Err.Error(), "did not finish within 2s") {
		t.Fatalf("a hook that hangs: %+v", r)
	}
	if time.Since(began) > time.Minute {
		t.Errorf("the hook held its caller %s", time.Since(began))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The child was killed with the group: its pidfd turns readable when
	// it exits (or it is gone already).
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone and reaped
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, int(time.Minute.Milliseconds())); n != 1 {
		t.Errorf("the hook's child %d outlived it by a minute (%v)", pid, err)
	}
}

// TestHookOutcomeSurvivesTheOrphanReaper: a worker that is a subreaper
// reaps its adopted orphans when calls end, at any moment; a hook's shell,
// in a process group of its own, must not be taken for one, or the hook's
// exit status is lost ("waitid: no child processes") and a pre-call hook
// that accepted the call refuses it.
func TestHookOutcomeSurvivesTheOrphanReaper(t *testing.T) {
	done := make(chan struct{})
	reaper := make(chan int)
	go func() {
		reaped := 0
		for {
			select {
			case <-done:
				reaper <- reaped
				return
			default:
				reaped += platform.ReapOrphans()
			}
		}
	}()
	for i := range 300 {
		r := Run(context.Background(), "exit 3", nil, nil, time.Minute)
		if r.Err != nil || r.Exit != 3 {
			t.Errorf("hook %d: %+v", i, r)
			break
		}
	}
	close(done)
	if n := <-reaper; n != 0 {
		t.Errorf("the reaper took %d of the hooks' processes", n)
	}
}
