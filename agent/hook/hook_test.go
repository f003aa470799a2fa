package hook

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHookAcceptsAndDeclines(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "stdin")
	t.Setenv("FLUKSIO_WORKER_TOKEN", "secret-token")
	r := Run(context.Background(), `cat > `+got+`; test -z "$FLUKSIO_WORKER_TOKEN" || { echo token seen >&2; exit 1; }`, []byte(`{"call_id":"c1"}`), nil, time.Minute)
	if !r.OK() {
		t.Fatalf("a hook that exits 0: %+v", r)
	}
	if b, _ := os.ReadFile(got); string(b) != `{"call_id":"c1"}` {
		t.Errorf("the hook read %q", b)
	}
	r = Run(context.Background(), "echo; echo '  the GPU is busy  ' >&2; echo second >&2; exit 3", nil, nil, time.Minute)
	if r.OK() || r.Exit != 3 || r.Reason != "the GPU is busy" {
		t.Errorf("a hook that exits 3: %+v", r)
	}
}

// TestHookThatHangsIsKilled: a hook past its bound is killed with
// everything it started, even a child that holds its stderr open.
func TestHookThatHangsIsKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	began := time.Now()
	r := Run(context.Background(), "sleep 600 & echo $! > "+pidFile+"; wait", nil, nil, 200*time.Millisecond)
	if r.OK() || !r.TimedOut || !strings.Contains(r.Err.Error(), "did not finish within 200ms") {
		t.Fatalf("a hook that hangs: %+v", r)
	}
	if time.Since(began) > time.Minute {
		t.Errorf("the hook held its caller %s", time.Since(began))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	// The child was killed with the group: once reaped by init it is gone
	// from /proc (a zombie until then, state Z).
	for {
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			break
		}
		time.Sleep(10 * time.Millisecond)
		if time.Since(began) > time.Minute {
			t.Fatalf("the hook's child %s outlived it: %s", pid, stat)
		}
	}
}
