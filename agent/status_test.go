package agent

import (
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// The status file is readable by other users of the host (`status`); the
// token must never be in it, even when it came in the URL.
func TestStatusFileHasNoToken(t *testing.T) {
	dir := t.TempDir()
	cfg := config.DefaultConfig()
	cfg.URL = "wss://e/api/v1/workers/attach?token=tok-in-url"
	cfg.Token = "tok-in-url"
	a := New(cfg, slog.New(slog.DiscardHandler), "/usr/bin/python3", dir)
	a.status.Update(func(s *status.Status) { s.LastError = "connecting to " + logging.ShownURL(cfg.URL) + ": refused" })
	a.status.Flush()
	b, err := os.ReadFile(status.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "tok-in-url") {
		t.Errorf("the status file shows the token:\n%s", b)
	}
	if st, err := status.Read(dir); err != nil || st.PID != os.Getpid() || st.State != "connecting" {
		t.Errorf("status = %+v, %v", st, err)
	}
}
