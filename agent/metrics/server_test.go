package metrics

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

func serveAt(t *testing.T, addr string, lim connLimits) (*Server, *enginetest.Buffer) {
	t.Helper()
	logs := &enginetest.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	ok := func() (bool, string) { return true, "ok" }
	s, err := listen(addr, New("test", 1), ok, ok, log, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, logs
}

func healthz(addr string) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// waitClosed reads from c until the server closes it (EOF or reset) or
// the deadline passes; it reports whether the server closed it.
func waitClosed(c net.Conn, deadline time.Time) bool {
	c.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// Clients holding connections open without a request cost the worker
// nothing past the cap: as many as are over it are closed at once, a
// probe still gets through once the idle ones time out, and those are
// closed by the server.
func TestIdleConnectionsAreCappedAndTimedOut(t *testing.T) {
	lim := connLimits{idle: time.Second, header: 2 * time.Second, read: 2 * time.Second, maxConns: 4}
	s, _ := serveAt(t, "127.0.0.1:0", lim)

	var held []net.Conn
	for range lim.maxConns + 3 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// Each one over the cap takes the place of the one silent longest:
	// three are closed at once, the others held until their header
	// timeout.
	soon := time.Now().Add(lim.header / 2)
	var closed atomic.Int32
	var wg sync.WaitGroup
	for _, c := range held {
		wg.Go(func() {
			if waitClosed(c, soon) {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := closed.Load(); n != 3 {
		t.Errorf("%d of %d idle connections were closed at once; want 3, as many as are over the cap of %d", n, len(held), lim.maxConns)
	}
	// The silent connections within the cap are cut off by the server.
	for i, c := range held {
		if !waitClosed(c, time.Now().Add(30*time.Second)) {
			t.Fatalf("idle connection %d is still open after 30 s", i)
		}
	}
	if err := healthz(s.Addr()); err != nil {
		t.Fatalf("/healthz after the idle connections: %v", err)
	}

	// A keep-alive connection that asked once and then waits is closed
	// after the idle timeout.
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !waitClosed(c, time.Now().Add(30*time.Second)) {
		t.Fatal("an idle keep-alive connection is still open after 30 s")
	}
}

// outOfFiles is a listener whose first accept fails as it does when the
// process has no file descriptor left.
type outOfFiles struct {
	net.Listener
	once sync.Once
}

func (l *outOfFiles) Accept() (net.Conn, error) {
	var err error
	l.once.Do(func() {
		err = &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	})
	if err != nil {
		return nil, err
	}
	return l.Listener.Accept()
}

// The HTTP server's own complaints (here: out of file descriptors) are
// records of the worker's logger, not raw lines on stderr.
func TestServerErrorsGoThroughTheLogger(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &enginetest.Buffer{}
	ok := func() (bool, string) { return true, "ok" }
	s := serve(&outOfFiles{Listener: tcp}, New("test", 1), ok, ok, slog.New(slog.NewJSONHandler(logs, nil)), defaultLimits)
	defer s.Close()
	if err := healthz(s.Addr()); err != nil {
		t.Fatalf("/healthz after a failed accept: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "too many open files") {
		if time.Now().After(deadline) {
			t.Fatalf("the server's complaint is not in the log: %q", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["level"] != "WARN" {
			t.Errorf("log line %q is not a WARN record", line)
		}
	}
}

// 0.0.0.0 is IPv4: the port is not reachable over IPv6.
func TestIPv4WildcardListensOnIPv4Only(t *testing.T) {
	if ln, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skip("no IPv6 loopback here")
	} else {
		ln.Close()
	}
	s, _ := serveAt(t, "0.0.0.0:0", defaultLimits)
	_, port, _ := net.SplitHostPort(s.Addr())
	if err := healthz("127.0.0.1:" + port); err != nil {
		t.Fatalf("over IPv4: %v", err)
	}
	if err := healthz("[::1]:" + port); err == nil {
		t.Fatal("--listen 0.0.0.0 answers over IPv6")
	}
}

func TestExposure(t *testing.T) {
	for addr, open := range map[string]bool{
		"127.0.0.1:9100": false, "localhost:9100": false, "[::1]:9100": false,
		"0.0.0.0:9100": true, ":9100": true, "[::]:9100": true, "10.1.2.3:9100": true,
	} {
		if got := Exposure(addr) != ""; got != open {
			t.Errorf("Exposure(%q) = %q; want open %v", addr, Exposure(addr), open)
		}
	}
}

// keepAlive is a client on one connection that asks, reads the answer and
// keeps the connection for its next request, as a scraper does.
type keepAlive struct {
	c net.Conn
	r *bufio.Reader
}

func (k *keepAlive) get(path string) error {
	if _, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// waitWaiting waits until n connections of s wait for a request.
func waitWaiting(t *testing.T, s *Server, n int) {
	t.Helper()
	l := s.ln.(*cappedListener)
	deadline := time.Now().Add(time.Minute)
	for {
		l.mu.Lock()
		waiting := 0
		for c := range l.open {
			if !c.waitingSince.IsZero() {
				waiting++
			}
		}
		l.mu.Unlock()
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections wait for a request after a minute", waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Clients that hold every slot, keep-alive ones between their requests
// or ones that connected and say nothing, do not lock out a probe: it
// takes the place of the connection that waited longest, and the others
// keep theirs.
func TestProbeGetsThroughAtTheCap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(*keepAlive) error // what each client does before the probe
	}{
		{"KeepAlive", func(k *keepAlive) error { return k.get("/metrics") }},
		{"Silent", func(*keepAlive) error { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := connLimits{idle: time.Hour, header: time.Hour, read: time.Hour, maxConns: 4}
			s, _ := serveAt(t, "127.0.0.1:0", lim)

			var clients []*keepAlive
			for i := range lim.maxConns {
				c, err := net.Dial("tcp", s.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				k := &keepAlive{c: c, r: bufio.NewReader(c)}
				if err := tc.first(k); err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				// One at a time, so that the first is the one that
				// waited longest.
				waitWaiting(t, s, i+1)
				clients = append(clients, k)
			}

			probe := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := probe.Get("http://" + s.Addr() + "/livez")
			if err != nil {
				t.Fatalf("probe with every slot held: %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("probe: %s", resp.Status)
			}

			if !waitClosed(clients[0].c, time.Now().Add(time.Minute)) {
				t.Fatal("the connection that waited longest is still open after a probe took its place")
			}
			for i, k := range clients[1:] {
				if err := k.get("/metrics"); err != nil {
					t.Errorf("client %d lost its connection to a probe: %v", i+1, err)
				}
			}
			if err := clients[0].get("/metrics"); err == nil {
				t.Error("the client whose connection was taken still got an answer on it")
			}
		})
	}
}
