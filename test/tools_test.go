package test

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// waitForCITools waits for the tools .ci/run builds in the background
// (GoReleaser, Helm): it holds an exclusive lock on the file
// $FLUKSIO_CI_TOOLS_LOCK names until they are installed, so only the
// tests that run them wait, not the whole suite. Outside CI the variable
// is unset and nothing waits.
func waitForCITools(t *testing.T) {
	t.Helper()
	path := os.Getenv("FLUKSIO_CI_TOOLS_LOCK")
	if path == "" {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("FLUKSIO_CI_TOOLS_LOCK: %v", err)
	}
	defer f.Close()
	start := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatalf("waiting for .ci/run's installs (flock %s): %v", path, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %v for .ci/run's background installs", waited.Round(time.Second))
	}
}
