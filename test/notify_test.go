package test

// The worker's side of systemd's notify protocol, against a notify socket
// of the test's own (what systemd gives a Type=notify service), so it runs
// without root; test/service_monitoring_test.go checks the same under a
// real systemd.

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// notifySocket collects what is sent to it, one datagram a message.
type notifySocket struct {
	path string
	mu   sync.Mutex
	msgs []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	n := &notifySocket{path: filepath.Join(t.TempDir(), "notify")}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, string(buf[:k]))
			n.mu.Unlock()
		}
	}()
	return n
}

// all returns every message so far.
func (n *notifySocket) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// count is how many messages were exactly msg.
func (n *notifySocket) count(msg string) int {
	k := 0
	for _, m := range n.all() {
		if m == msg {
			k++
		}
	}
	return k
}

// lastStatus is the last STATUS= sent.
func (n *notifySocket) lastStatus() string {
	status := ""
	for _, m := range n.all() {
		if s, ok := strings.CutPrefix(m, "STATUS="); ok {
			status = s
		}
	}
	return status
}

// TestServiceManagerNotify: READY=1 while the engine is still down (it must
// not gate the unit's start), a STATUS= that says why it is not attached and
// then as whom it is, WATCHDOG=1 at the asked pace, STOPPING=1 on SIGTERM;
// and none of systemd's variables reach node code.
func TestServiceManagerNotify(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	eng.Close() // down at boot
	sock := listenNotify(t)
	w := startWorker(t, eng, []string{"NOTIFY_SOCKET=" + sock.path, "WATCHDOG_USEC=400000"}, "--name", "n-box")

	eventually(t, 20*time.Second, "READY=1 with the engine down", func() bool { return sock.count("READY=1") == 1 })
	eventually(t, 10*time.Second, "a status that says why it is not attached", func() bool {
		return strings.HasPrefix(sock.lastStatus(), "not attached to "+eng.AttachURL()+", retrying: ")
	})
	// 400 ms asks for a ping at least every 200 ms.
	before := sock.count("WATCHDOG=1")
	time.Sleep(time.Second)
	if pings := sock.count("WATCHDOG=1") - before; pings < 3 {
		t.Errorf("%d watchdog pings in a second with WatchdogSec=400ms; want one every 200 ms", pings)
	}

	if err := eng.Restart(0); err != nil {
		t.Fatal(err)
	}
	wk := attach(t, eng)
	attached := `attached as "n-box" to ` + eng.AttachURL() + "; calls: 0 running, 0 done"
	eventually(t, 10*time.Second, "the status to say it is attached", func() bool { return sock.lastStatus() == attached })
	answer, _ := wait(t, run(t, wk, "n1", step{"env": []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}}))
	if !answer.OK || strings.Contains(string(answer.Raw), sock.path) || strings.Contains(string(answer.Raw), "400000") {
		t.Errorf("node code saw systemd's variables, meant for the worker alone: %s", answer.Raw)
	}
	eventually(t, 10*time.Second, "the status to count the call", func() bool {
		return strings.HasSuffix(sock.lastStatus(), "calls: 0 running, 1 done")
	})

	w.signal(syscall.SIGTERM)
	if code := w.wait(30 * time.Second); code != 0 {
		t.Errorf("exit %d", code)
	}
	if sock.count("STOPPING=1") == 0 {
		t.Error("no STOPPING=1 on SIGTERM")
	}
	for _, m := range sock.all() {
		if strings.Contains(m, testToken) {
			t.Errorf("the worker told systemd its token: %q", m)
		}
	}
	if got := sock.count("READY=1"); got != 1 {
		t.Errorf("READY=1 sent %d times, want once", got)
	}
}

// TestNoWatchdogPingsUnasked: a watchdog systemd set for another process
// (WATCHDOG_PID is not the worker's) gets no pings from the worker.
func TestNoWatchdogPingsUnasked(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	sock := listenNotify(t)
	startWorker(t, eng, []string{"NOTIFY_SOCKET=" + sock.path, "WATCHDOG_USEC=400000", "WATCHDOG_PID=" + strconv.Itoa(1)})
	attach(t, eng)
	eventually(t, 20*time.Second, "READY=1", func() bool { return sock.count("READY=1") == 1 })
	time.Sleep(1500 * time.Millisecond)
	if pings := sock.count("WATCHDOG=1"); pings != 0 {
		t.Errorf("%d watchdog pings for a watchdog meant for pid 1", pings)
	}
}
