package platform

import (
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenNotify is systemd's end of the notify socket.
func listenNotify(t *testing.T) (*net.UnixConn, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, path
}

func next(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

// What systemd hears: READY, a STATUS line (not repeated), watchdog pings
// with WatchdogSec=, RELOADING with its timestamp, STOPPING.
func TestServiceManagerNotifies(t *testing.T) {
	conn, path := listenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "4000000")
	t.Setenv("WATCHDOG_PID", "")
	m := NewServiceManager(slog.New(slog.DiscardHandler))
	if !m.Enabled() {
		t.Error("Enabled() is false with NOTIFY_SOCKET set")
	}
	if m.WatchdogPeriod() != 4*time.Second {
		t.Errorf("WatchdogPeriod() = %v; want WATCHDOG_USEC's 4s", m.WatchdogPeriod())
	}
	m.Ready()
	if got := next(t, conn); got != "READY=1" {
		t.Errorf("Ready sent %q", got)
	}
	m.Status("attached\nas w1")
	m.Status("attached\nas w1") // the same line is not sent again
	m.Watchdog()
	if got := next(t, conn); got != "STATUS=attached as w1" {
		t.Errorf("Status sent %q; want one line", got)
	}
	if got := next(t, conn); got != "WATCHDOG=1" {
		t.Errorf("after a repeated status, got %q; want the watchdog ping", got)
	}
	m.Reloading()
	if got := next(t, conn); !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") {
		t.Errorf("Reloading sent %q", got)
	}
	m.Stopping()
	if got := next(t, conn); got != "STOPPING=1" {
		t.Errorf("Stopping sent %q", got)
	}
	// The last word: what a unit that ended shows, not what it was doing.
	m.Stopped(1, "refused by the engine")
	if got := next(t, conn); got != "STATUS=stopped: refused by the engine (exit code 1)" {
		t.Errorf("Stopped sent %q", got)
	}
}

// Outside systemd nothing is sent and nothing fails.
func TestServiceManagerOutsideSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	m := NewServiceManager(nil)
	if m.Enabled() {
		t.Error("Enabled() outside systemd")
	}
	m.Ready()
	m.Status("x")
	m.Watchdog()
	m.Reloading()
	m.Stopping()
	m.Stopped(0, "x")
	if m.WatchdogPeriod() != 0 {
		t.Errorf("WatchdogPeriod() = %v outside systemd", m.WatchdogPeriod())
	}
}

// A socket that went away is said once in the log, not at every pulse.
func TestServiceManagerSocketGone(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone"))
	var log strings.Builder
	m := NewServiceManager(slog.New(slog.NewTextHandler(&log, nil)))
	m.Ready()
	m.Status("a")
	m.Status("b")
	if n := strings.Count(log.String(), "could not notify the service manager"); n != 1 {
		t.Errorf("the failure was logged %d times; want once:\n%s", n, log.String())
	}
}

func TestWithoutServiceManager(t *testing.T) {
	env := []string{"PATH=/bin", "NOTIFY_SOCKET=/run/x", "WATCHDOG_PID=1", "WATCHDOG_USEC=5", "NOTIFY_SOCKETS=kept"}
	got := WithoutServiceManager(env)
	if strings.Join(got, " ") != "PATH=/bin NOTIFY_SOCKETS=kept" {
		t.Errorf("WithoutServiceManager = %q", got)
	}
	if len(env) != 5 || env[1] != "NOTIFY_SOCKET=/run/x" {
		t.Errorf("the caller's slice changed: %q", env)
	}
}
