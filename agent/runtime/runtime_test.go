package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
)

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// engineServing is an engine that serves GET /api/v1/workers/runtime as
// handler says, counting requests.
func engineServing(t *testing.T, handler http.HandlerFunc) (config.Config, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/workers/runtime", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "Bearer tok-1" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		handler(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cfg := config.DefaultConfig()
	cfg.URL = "ws" + strings.TrimPrefix(srv.URL, "http") + "/api/v1/workers/attach?pool=x"
	cfg.Token = "tok-1"
	return cfg, &hits
}

func captureLog() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

func checkRuntimeFile(t *testing.T, rt Script, stateDir string, content []byte, source string) {
	t.Helper()
	if rt.Source != source {
		t.Errorf("runtime source = %q, want %q", rt.Source, source)
	}
	if rt.Hash != sha(content) {
		t.Errorf("runtime hash = %q, want the content's sha256 %q", rt.Hash, sha(content))
	}
	if want := filepath.Join(stateDir, "runtime", sha(content)+".py"); rt.Path != want {
		t.Errorf("runtime path = %q, want %q", rt.Path, want)
	}
	got, err := os.ReadFile(rt.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("%s holds %d bytes, not the %s runner's %d", rt.Path, len(got), source, len(content))
	}
}

func TestEnsureRuntimeAutoUsesTheEnginesRunner(t *testing.T) {
	served := []byte("# the engine's runner\nimport sys\n")
	cfg, hits := engineServing(t, func(w http.ResponseWriter, r *http.Request) { w.Write(served) })
	log, logged := captureLog()
	state := t.TempDir()

	rt, err := Ensure(context.Background(), cfg, state, log)
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt, state, served, "engine")
	if hits.Load() != 1 {
		t.Errorf("the engine was asked %d times, want 1", hits.Load())
	}
	if strings.Contains(logged.String(), "level=WARN") {
		t.Errorf("warned although the engine served a runner:\n%s", logged)
	}
}

func TestEnsureRuntimeAutoFallsBackToEmbedded(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		warn    string // "" when no warning is expected
	}{
		{"404: the engine serves no runner", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, ""},
		{"405: neither", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusMethodNotAllowed) }, ""},
		{"426: the socket alone", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "upgrade", http.StatusUpgradeRequired) }, ""},
		{"401: not for workers", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "log in", http.StatusUnauthorized) }, ""},
		{"500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, "/api/v1/workers/runtime: 500"},
		{"an empty runner", func(w http.ResponseWriter, r *http.Request) {}, "0 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, hits := engineServing(t, tt.handler)
			log, logged := captureLog()
			state := t.TempDir()
			rt, err := Ensure(context.Background(), cfg, state, log)
			if err != nil {
				t.Fatal(err)
			}
			checkRuntimeFile(t, rt, state, embeddedRuntime, "embedded")
			if hits.Load() != 1 {
				t.Errorf("the engine was asked %d times, want 1", hits.Load())
			}
			warned := strings.Contains(logged.String(), "level=WARN")
			switch {
			case tt.warn == "" && warned:
				t.Errorf("warned about an engine that serves no runner (normal):\n%s", logged)
			case tt.warn != "" && !warned:
				t.Errorf("no warning that the engine's runner could not be fetched:\n%s", logged)
			case tt.warn != "" && !strings.Contains(logged.String(), tt.warn):
				t.Errorf("the warning does not say %q:\n%s", tt.warn, logged)
			}
		})
	}
}

// An engine that serves no runner is normal: said once, at INFO, with the
// URL that was asked.
func TestEngineServesNoRunnerSaidOnce(t *testing.T) {
	notServedOnce = sync.Once{}
	cfg, hits := engineServing(t, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	log, logged := captureLog()
	for range 3 {
		if _, err := Ensure(context.Background(), cfg, t.TempDir(), log); err != nil {
			t.Fatal(err)
		}
	}
	want := "level=INFO msg=\"the engine serves no runner; using the embedded one\" url=" + config.HTTPBase(cfg.URL, "/workers/runtime")
	if n := strings.Count(logged.String(), want); n != 1 || hits.Load() != 3 {
		t.Errorf("%d lines saying %q after 3 attaches (%d asked):\n%s", n, want, hits.Load(), logged)
	}
}

func TestEnsureRuntimeAutoWithEngineUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.Listener.Addr().String()
	srv.Close()
	cfg := config.DefaultConfig()
	cfg.URL = "ws://" + addr + "/api/v1/workers/attach"
	cfg.Token = "tok-1"
	log, logged := captureLog()
	state := t.TempDir()
	rt, err := Ensure(context.Background(), cfg, state, log)
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt, state, embeddedRuntime, "embedded")
	// The attach after it fails the same way and says so: nothing more
	// here than a debug line.
	if strings.Contains(logged.String(), "level=WARN") || strings.Contains(logged.String(), "level=INFO") || !strings.Contains(logged.String(), "level=DEBUG") {
		t.Errorf("an unreachable engine's runner fetch logged above debug, or nothing:\n%s", logged)
	}
}

func TestEnsureRuntimeEmbeddedAsksNobody(t *testing.T) {
	cfg, hits := engineServing(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("x")) })
	cfg.Runtime = "embedded"
	state := t.TempDir()
	rt, err := Ensure(context.Background(), cfg, state, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt, state, embeddedRuntime, "embedded")
	if hits.Load() != 0 {
		t.Errorf("--runtime embedded asked the engine %d times", hits.Load())
	}
}

func TestEnsureRuntimeFile(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "runner.py")
	content := []byte("print('mine')\n")
	if err := os.WriteFile(script, content, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultConfig()
	cfg.Runtime = script
	rt, err := Ensure(context.Background(), cfg, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if rt.Path != script || rt.Source != "file" || rt.Hash != sha(content) {
		t.Errorf("--runtime %s: %+v", script, rt)
	}

	cfg.Runtime = filepath.Join(dir, "missing.py")
	_, err = Ensure(context.Background(), cfg, t.TempDir(), slog.New(slog.DiscardHandler))
	var usage *config.UsageError
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), "--runtime") || !strings.Contains(err.Error(), "missing.py") || !strings.Contains(err.Error(), "auto, embedded") {
		t.Errorf("error = %v (%T), want a usage error naming --runtime, missing.py and auto, embedded", err, err)
	}
}

func TestCacheRuntimeWritesOncePerContent(t *testing.T) {
	state := t.TempDir()
	content := []byte("print('v1')\n")
	rt, err := cacheRuntime(state, content, "engine")
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt, state, content, "engine")
	if st, err := os.Stat(rt.Path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("runner file mode = %v, %v; want 0600 (private, like the state directory)", st.Mode(), err)
	}

	// Mark the file; a second cache of the same content must leave it be.
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(rt.Path, old, old); err != nil {
		t.Fatal(err)
	}
	again, err := cacheRuntime(state, content, "engine")
	if err != nil || again != rt {
		t.Fatalf("second cacheRuntime = %+v, %v; want %+v", again, err, rt)
	}
	if st, _ := os.Stat(rt.Path); !st.ModTime().Equal(old) {
		t.Errorf("the cached runner was rewritten (mtime %v)", st.ModTime())
	}

	// New content is a new file; the old one stays for a worker using it.
	v2 := []byte("print('v2')\n")
	rt2, err := cacheRuntime(state, v2, "engine")
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt2, state, v2, "engine")
	checkRuntimeFile(t, rt, state, content, "engine")

	// Atomic: nothing but the two runners is left in the directory.
	entries, err := os.ReadDir(filepath.Join(state, "runtime"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 {
		t.Errorf("runtime directory holds %q, want only the two runners", names)
	}
}

// A file of the right name but the wrong size (a crash in an older
// version, a disk that filled) is replaced.
func TestCacheRuntimeRepairsATruncatedFile(t *testing.T) {
	state := t.TempDir()
	content := []byte("print('whole runner')\n")
	path := filepath.Join(state, "runtime", sha(content)+".py")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, content[:5], 0o644); err != nil {
		t.Fatal(err)
	}
	rt, err := cacheRuntime(state, content, "embedded")
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt, state, content, "embedded")
}

func TestCacheRuntimeUnwritableStateDir(t *testing.T) {
	// A regular file where the state directory should be: unwritable even
	// for root.
	notDir := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := cacheRuntime(notDir, []byte("x"), "embedded")
	if err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("cacheRuntime in an unwritable state dir: %v; want an error saying to set --state-dir", err)
	}

	cfg := config.DefaultConfig()
	cfg.Runtime = "embedded"
	_, err = Ensure(context.Background(), cfg, notDir, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Errorf("EnsureRuntime in an unwritable state dir: %v; want an error saying to set --state-dir", err)
	}
}
