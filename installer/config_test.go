package installer

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/platform"
)

func TestWriteConfigProtectsTheFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "fluksio-worker")
	path := filepath.Join(dir, "config.toml")
	who := platform.KeepOwner
	if os.Geteuid() == 0 {
		who = platform.Owner{UID: 4242, GID: 4343} // as root, hand it to someone else
	}
	// A permissive umask must not leak into the modes.
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	if err := writeConfig(path, []byte("token = \"s3cret\"\n"), who, systemConfigDirMode); err != nil {
		t.Fatal(err)
	}
	st := stat(t, path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v, want 0600", st.Mode().Perm())
	}
	dst := stat(t, dir)
	if dst.Mode().Perm() != 0o750 {
		t.Errorf("config dir mode %v, want 0750", dst.Mode().Perm())
	}
	if who != platform.KeepOwner {
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != who.UID || int(sys.Gid) != who.GID {
			t.Errorf("config owned by %d:%d, want %d:%d", sys.Uid, sys.Gid, who.UID, who.GID)
		}
		dsys := dst.Sys().(*syscall.Stat_t)
		if dsys.Uid != 0 || int(dsys.Gid) != who.GID {
			t.Errorf("config dir owned by %d:%d, want root with the service's group %d", dsys.Uid, dsys.Gid, who.GID)
		}
	}
	// An existing directory that is too open is tightened.
	os.Chmod(dir, 0o777)
	if err := writeConfig(path, []byte("x = 1\n"), platform.KeepOwner, systemConfigDirMode); err != nil {
		t.Fatal(err)
	}
	if m := stat(t, dir).Mode().Perm(); m != 0o750 {
		t.Errorf("a 0777 config dir stayed %v", m)
	}
}

// TestWriteConfigIsAtomic rewrites the config while another goroutine keeps
// reading it: every read must be one whole version, and nothing is left
// beside it.
func TestWriteConfigIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	versions := [][]byte{
		bytes.Repeat([]byte("# padding so a torn write would show\n"), 3000),
		bytes.Repeat([]byte("# another version, of another length\n"), 1000),
	}
	if err := writeConfig(path, versions[0], platform.KeepOwner, userConfigDirMode); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var torn int
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil || (!bytes.Equal(b, versions[0]) && !bytes.Equal(b, versions[1])) {
				torn++
			}
		}
	}()
	for i := 0; i < 200; i++ {
		if err := writeConfig(path, versions[i%2], platform.KeepOwner, userConfigDirMode); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if torn > 0 {
		t.Errorf("a reader saw a missing or partial config %d times", torn)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestLoadConfigReadsWhatRunReads(t *testing.T) {
	values := map[string]any{
		"url":          "wss://engine.example.com/api/v1/workers/attach",
		"token":        "s3cret",
		"labels":       []string{"gpu", "cuda12"},
		"parallel":     int64(2),
		"gpus":         int64(0),
		"cancel-grace": "10s",
		"max-idle":     int64(300),
		"state-dir":    "/var/lib/fluksio-worker",
		"python":       "/usr/bin/python3",
	}
	got, err := loadConfig(values)
	if err != nil {
		t.Fatal(err)
	}
	data, err := encodeConfig(values)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(path, data, 0o600)
	want, err := config.Load([]string{"--config", path}, func(string) string { return "" })
	if err == nil {
		err = want.Resolve()
	}
	if err != nil {
		t.Fatalf("run cannot read the config install writes: %v\n%s", err, data)
	}
	want.File = "" // which file it read: install checks the values before there is one
	if !reflect.DeepEqual(got, want) {
		t.Errorf("install checked\n%+v\nbut run reads\n%+v", got, want)
	}
	if got.GPUs == nil || *got.GPUs != 0 || got.Parallel != 2 || len(got.Labels) != 2 {
		t.Errorf("values lost on the way: %+v", got)
	}
	if !strings.HasPrefix(string(data), "# fluksio-worker configuration") {
		t.Errorf("the config does not say what it is:\n%s", data)
	}
}

func TestLoadConfigRejectsUnknownKeys(t *testing.T) {
	_, err := loadConfig(map[string]any{"url": "wss://e/api/v1/workers/attach", "token": "t", "tokn": "x"})
	if err == nil || !strings.Contains(err.Error(), `"tokn"`) {
		t.Errorf("unknown key: %v", err)
	}
}

func stat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
