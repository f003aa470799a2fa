package engine

// The connection against the fake engine on loopback: the attach (and
// what is refused, and how, with the token never shown), the single
// writer, batching, a clean close and a peer that is gone.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

const token = "engine-test-token-1b7e9d"

const waitLong = 30 * time.Second

func startEngine(t *testing.T, opts enginetest.Options) *enginetest.Engine {
	t.Helper()
	if opts.Tokens == nil {
		opts.Tokens = []string{token}
	}
	eng, err := enginetest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	return eng
}

func configFor(url string) config.Config {
	cfg := config.DefaultConfig()
	cfg.URL, cfg.Token = url, token
	return cfg
}

func hello(name string) protocol.Hello {
	return protocol.Hello{Op: protocol.OpHello, Protocol: protocol.Version, Name: name, Labels: []string{}}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), waitLong)
	t.Cleanup(cancel)
	return c
}

// attach connects a Conn to eng and returns both ends.
func attach(t *testing.T, eng *enginetest.Engine) (*Conn, *enginetest.Worker) {
	t.Helper()
	conn, name, err := Attach(ctx(t), configFor(eng.AttachURL()), hello("w1"))
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(conn.Abort)
	if name != "w1" {
		t.Errorf("welcomed as %q; want the name the worker gave", name)
	}
	wk, err := eng.NextWorker(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if wk.Hello.Name != "w1" || strings.Contains(string(wk.Hello.Raw), token) {
		t.Errorf("the engine got hello %s", wk.Hello.Raw)
	}
	return conn, wk
}

// The token travels as ?token= and as a bearer header on the upgrade.
func TestTheUpgradeCarriesTheToken(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	attach(t, eng)
	a := eng.Attempts()
	if len(a) != 1 {
		t.Fatalf("%d attach attempts, want 1", len(a))
	}
	if got := a[0].Header.Get("Authorization"); got != "Bearer "+token {
		t.Errorf("Authorization: %q, want the bearer token", got)
	}
	if got := a[0].URL.Query().Get("token"); got != token {
		t.Errorf("?token=%q, want the token", got)
	}
}

// Frames from many goroutines arrive whole, each sender's in its order:
// one goroutine writes the socket.
func TestConcurrentSendsArriveWholeAndInOrder(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	conn, wk := attach(t, eng)
	const senders, each = 8, 300
	calls := make([]*enginetest.Call, senders)
	for s := range senders {
		calls[s] = wk.Expect(fmt.Sprintf("c%d", s))
	}
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				frame := fmt.Sprintf(`{"call_id":"c%d","event":"stream","values":{"i":%d},"pad":%q}`, s, i, strings.Repeat("x", i))
				if !conn.Send([]byte(frame)) {
					t.Errorf("Send reported the connection gone")
					return
				}
			}
			conn.SendJSON(map[string]any{"call_id": fmt.Sprintf("c%d", s), "ok": true})
		}()
	}
	wg.Wait()
	for s, c := range calls {
		answer, events, err := c.WaitTimeout(waitLong)
		if err != nil || !answer.OK {
			t.Fatalf("sender %d: answer %s, %v", s, answer.Raw, err)
		}
		if len(events) != each {
			t.Fatalf("sender %d: %d events; want %d", s, len(events), each)
		}
		for i, m := range events {
			var ev struct{ Values struct{ I int } }
			if err := json.Unmarshal(m.Raw, &ev); err != nil || ev.Values.I != i {
				t.Fatalf("sender %d: event %d is %s (%v)", s, i, m.Raw, err)
			}
		}
	}
}

// The engine's messages come back from Read, and an engine's ping is
// answered (the reader's pong), so the connection stays up.
func TestReadAndPing(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	conn, wk := attach(t, eng)
	if err := wk.Send(map[string]any{"op": "run", "call_id": "x"}); err != nil {
		t.Fatal(err)
	}
	data, err := conn.Read()
	if err != nil || !strings.Contains(string(data), `"call_id":"x"`) {
		t.Fatalf("Read: %q, %v", data, err)
	}
}

// Once batching is on, writes wait in the buffer and leave together on
// Flush: many frames, one write(2).
func TestBatchedWritesLeaveOnFlush(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	counting := &countingConn{Conn: client}
	d := &batchDialer{}
	d.conn = &batchConn{Conn: counting}
	d.conn.w = bufio.NewWriterSize(counting, batchSize)
	got := make(chan string, 1)
	go func() {
		var all []byte
		buf := make([]byte, 1024)
		for len(all) < len("hellofirstsecondthird") {
			n, err := server.Read(buf)
			if err != nil {
				break
			}
			all = append(all, buf[:n]...)
		}
		got <- string(all)
	}()
	b := d.conn
	b.Write([]byte("hello")) // the handshake goes out as written
	if counting.writes() != 1 {
		t.Fatalf("%d writes before batching; want 1", counting.writes())
	}
	b.batch()
	for _, s := range []string{"first", "second", "third"} {
		b.Write([]byte(s))
	}
	if n := counting.writes(); n != 1 {
		t.Errorf("%d writes after three batched frames before Flush; want still 1", n)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := counting.writes(); n != 2 {
		t.Errorf("%d writes after Flush; want 2 (the three frames in one)", n)
	}
	if s := <-got; s != "hellofirstsecondthird" {
		t.Errorf("the peer read %q", s)
	}
}

// While batching, the write deadline (which gorilla/websocket sets before
// every frame) reaches the socket only when the buffer goes out to it, at a
// Flush or a write the buffer cannot hold: one timer reset a write(2), not
// one a frame. The socket's writes keep the deadline last set.
func TestBatchedWriteDeadlineReachesTheSocketWithTheBuffer(t *testing.T) {
	t.Parallel()
	for _, flush := range []bool{true, false} {
		client, server := net.Pipe()
		defer client.Close()
		defer server.Close()
		go io.Copy(io.Discard, server)
		b := &batchConn{Conn: client, w: bufio.NewWriterSize(client, batchSize)}
		b.batch()
		b.SetWriteDeadline(time.Now().Add(-time.Second))
		if _, err := b.Write([]byte("frame")); err != nil {
			t.Fatalf("a buffered write: %v", err)
		}
		if _, err := client.Write([]byte("direct")); err != nil {
			t.Fatalf("the socket got the deadline with a frame that stayed in the buffer: %v", err)
		}
		var err error
		if flush {
			err = b.Flush()
		} else {
			_, err = b.Write(make([]byte, batchSize))
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("the buffer went out (flush %v) past its deadline: %v", flush, err)
		}
	}
}

type countingConn struct {
	net.Conn
	mu sync.Mutex
	n  int
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Close sends what is queued, then a normal close frame.
func TestCleanClose(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	conn, wk := attach(t, eng)
	c := wk.Expect("last")
	go func() {
		for {
			if _, err := conn.Read(); err != nil {
				return
			}
		}
	}()
	conn.SendJSON(map[string]any{"call_id": "last", "ok": true})
	conn.Close()
	if answer, _, err := c.WaitTimeout(waitLong); err != nil || !answer.OK {
		t.Errorf("the frame queued before Close: %s, %v", answer.Raw, err)
	}
	select {
	case <-wk.Done():
	case <-time.After(waitLong):
		t.Fatal("the engine's end is still open after Close")
	}
	if code, text := wk.CloseFrame(); code != enginetest.CloseNormal || text != "worker stopping" {
		t.Errorf("close frame %d %q; want a normal close, worker stopping", code, text)
	}
	conn.Close() // twice is fine
}

// A peer that is gone ends Read with an error, and Send says so.
func TestDeadPeer(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	conn, wk := attach(t, eng)
	wk.Drop()
	if _, err := conn.Read(); err == nil {
		t.Fatal("Read after the engine dropped the connection returned no error")
	}
	// Nothing writes any more: more frames than the outbox holds must
	// still not block a runner's relay.
	sent := make(chan bool, 1)
	go func() {
		queued := true
		for range 8 * outboxSize { // a Send may still queue while the outbox has room
			queued = conn.Send([]byte(`{"event":"x"}`))
		}
		sent <- queued
	}()
	select {
	case queued := <-sent:
		if queued {
			t.Error("Send with the outbox full on a dead connection reported the frame queued")
		}
	case <-time.After(waitLong):
		t.Fatal("Send blocked on a dead connection")
	}
	conn.Abort() // idempotent
}

// What the engine refuses, and how: a refusal is a *RefusedError (the
// worker exits), anything else an error to retry; neither shows the token.
func TestAttachFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opts    enginetest.Options
		url     func(*enginetest.Engine) string
		refused bool
		want    string
	}{
		{name: "refusal", opts: enginetest.Options{Refuse: "unknown worker " + token}, refused: true, want: "unknown worker"},
		{name: "wrong token", opts: enginetest.Options{Tokens: []string{"another"}}, refused: true, want: "check the token"},
		{name: "echoing error page", opts: enginetest.Options{EchoStatus: 404}, want: "HTTP 404"},
		{name: "redirect", opts: enginetest.Options{RedirectTo: "wss://elsewhere.example.com/attach"}, want: "redirects to wss://elsewhere.example.com/attach"},
		{name: "not a JSON answer", opts: enginetest.Options{HelloAnswers: []string{"<html>hi</html>"}}, want: "not a JSON object"},
		{name: "wrong path", url: func(e *enginetest.Engine) string { return "ws://" + e.Addr() + "/nothing" }, want: "HTTP 404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eng := startEngine(t, tc.opts)
			url := eng.AttachURL()
			if tc.url != nil {
				url = tc.url(eng)
			}
			refused, err := attachFails(t, url, tc.refused)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q; want it to say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), token) || (refused != nil && strings.Contains(refused.Reason, token)) {
				t.Errorf("the error shows the token: %v", err)
			}
		})
	}
}

// attachFails attaches to url, which must fail: refused (a
// *protocol.RefusedError, returned) or not, as wantRefused says.
func attachFails(t *testing.T, url string, wantRefused bool) (*protocol.RefusedError, error) {
	t.Helper()
	_, _, err := Attach(ctx(t), configFor(url), hello("w"))
	var refused *protocol.RefusedError
	switch {
	case err == nil:
		t.Fatal("Attach succeeded")
	case errors.As(err, &refused) != wantRefused:
		t.Fatalf("refused %v, want %v: %v", !wantRefused, wantRefused, err)
	}
	return refused, err
}

func TestAttachUsageErrors(t *testing.T) {
	t.Parallel()
	_, _, err := Attach(ctx(t), configFor("ws://[::1"+token), hello("w"))
	var usage *config.UsageError
	if !errors.As(err, &usage) || strings.Contains(err.Error(), token) {
		t.Errorf("a URL that does not parse: %v; want a usage error without the token", err)
	}
	cfg := configFor("wss://127.0.0.1:1/api/v1/workers/attach")
	cfg.CAFile = filepath.Join(t.TempDir(), "missing.pem")
	if _, _, err := Attach(ctx(t), cfg, hello("w")); !errors.As(err, &usage) {
		t.Errorf("a --ca-file that is not there: %v; want a usage error", err)
	}
	// Nothing listens: an error to retry, naming the address.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	_, _, err = Attach(ctx(t), configFor("ws://"+addr+"/api/v1/workers/attach"), hello("w"))
	if err == nil || !strings.Contains(err.Error(), "connecting to ws://"+addr) {
		t.Errorf("nothing listening: %v", err)
	}
}

// TLS with the engine's authority in --ca-file; without it the error
// says what to do.
func TestAttachOverTLS(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{TLS: true})
	cfg := configFor(eng.AttachURL())
	if _, _, err := Attach(ctx(t), cfg, hello("w")); err == nil || !strings.Contains(err.Error(), "--ca-file") {
		t.Errorf("an engine whose certificate the system does not trust: %v; want advice naming --ca-file", err)
	}
	cfg.CAFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(cfg.CAFile, eng.CACertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, _, err := Attach(ctx(t), cfg, hello("w"))
	if err != nil {
		t.Fatalf("Attach with --ca-file: %v", err)
	}
	conn.Abort()
}

// CheckAttach attaches, then closes cleanly at once.
func TestProbe(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	if err := CheckAttach(ctx(t), configFor(eng.AttachURL()), hello("probe")); err != nil {
		t.Fatalf("CheckAttach: %v", err)
	}
	wk, err := eng.NextWorker(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-wk.Done():
	case <-time.After(waitLong):
		t.Fatal("CheckAttach left the connection open")
	}
	if code, text := wk.CloseFrame(); code != enginetest.CloseNormal || text != "check done" {
		t.Errorf("CheckAttach closed with %d %q", code, text)
	}
	refusing := startEngine(t, enginetest.Options{Refuse: "no " + token})
	err = CheckAttach(ctx(t), configFor(refusing.AttachURL()), hello("probe"))
	var refused *protocol.RefusedError
	if !errors.As(err, &refused) || strings.Contains(err.Error(), token) {
		t.Errorf("CheckAttach of a refusing engine: %v; want a refusal without the token", err)
	}
}
