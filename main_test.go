package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// `help COMMAND` is what `COMMAND --help` prints.
func TestHelpCommand(t *testing.T) {
	for _, name := range []string{"install", "status", "copy", "version"} {
		var viaHelp, viaFlag, errs bytes.Buffer
		if code := dispatch(context.Background(), []string{"help", name}, &viaHelp, &errs); code != config.ExitOK {
			t.Errorf("help %s: exit %d: %s", name, code, errs.String())
		}
		dispatch(context.Background(), []string{name, "--help"}, &viaFlag, &errs)
		if viaHelp.String() != viaFlag.String() || !strings.HasPrefix(viaHelp.String(), "Usage: ") || !strings.Contains(viaHelp.String(), "fluksio-worker "+name) {
			t.Errorf("help %s printed:\n%s\nwant %s --help:\n%s", name, viaHelp.String(), name, viaFlag.String())
		}
	}
	var out, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"help", "instal"}, &out, &errs); code != config.ExitUsage || !strings.Contains(errs.String(), `no command "instal"`) {
		t.Errorf("help instal: exit %d: %s", code, errs.String())
	}
}

// copy does not create its directory: a mistyped mount path fails.
func TestCopyNeedsAnExistingDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "fluksio", "bin")
	var out, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"copy", missing}, &out, &errs); code != config.ExitFailed || !strings.Contains(errs.String(), missing+" does not exist") {
		t.Errorf("copy into a missing directory: exit %d: %s", code, errs.String())
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("copy created %s", missing)
	}
	dir := t.TempDir()
	if code := dispatch(context.Background(), []string{"copy", dir}, &out, &errs); code != config.ExitOK {
		t.Fatalf("copy into %s: exit %d: %s", dir, code, errs.String())
	}
	if st, err := os.Stat(filepath.Join(dir, "fluksio-worker")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("the copy: %v %v", st, err)
	}
}
