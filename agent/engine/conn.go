// Package engine owns the connection to the engine: dialing it (the token
// as ?token= and a bearer header, --ca-file, redirects refused, errors that
// never show the token), the hello and welcome, and the attached
// connection, which one goroutine writes (a bounded outbox, frames batched
// into few system calls, keepalive pings) until it closes cleanly or is
// lost. The messages themselves are agent/protocol's.
package engine

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// Connection constants: keepalive, handshake and write bounds.
const (
	// pingInterval and pongWait: a WebSocket ping every 20 s, and a peer
	// that has not answered within 20 s more is gone (a NAT that dropped the
	// connection sends no FIN, so only this notices).
	pingInterval = 20 * time.Second
	pongWait     = 20 * time.Second
	// handshakeTimeout bounds dialing, TLS, the upgrade, and the welcome.
	handshakeTimeout = 30 * time.Second
	// writeTimeout: a frame the engine has not taken in this long means the
	// connection is dead, not slow.
	writeTimeout = 60 * time.Second
	// outboxSize bounds queued outgoing frames; when it is full, runners
	// block on their stdout pipe instead of the agent buffering without end.
	outboxSize = 256
	// closeWait is how long a clean close waits for the engine's close frame.
	closeWait = 2 * time.Second
)

// dialScrubbed opens the WebSocket with the token as the ?token= query
// parameter (engines read it there) and as a bearer header. Its errors
// never show the token: the URL is shown without its query, and what the
// engine answered (a page that echoes the request URL) is scrubbed.
func dialScrubbed(ctx context.Context, cfg config.Config, offer time.Duration) (*websocket.Conn, *batchConn, error) {
	ws, raw, err := dial(ctx, cfg, offer)
	return ws, raw, ScrubError(cfg.Token, err)
}

// ScrubError wraps err so its text never shows the token wherever it is
// printed; a refusal's reason, which callers print on its own, is scrubbed
// in place.
func ScrubError(token string, err error) error {
	if err == nil {
		return nil
	}
	r := logging.NewRedactor(token)
	var refused *protocol.RefusedError
	if errors.As(err, &refused) {
		refused.Reason = r.Scrub(refused.Reason)
	}
	return r.Error(err)
}

// dial opens the WebSocket. With offer > 0 the upgrade offers the resume
// extension with that grace: a header, which an engine that does not know
// it never reads, so the conversation stays plain protocol 2 there.
func dial(ctx context.Context, cfg config.Config, offer time.Duration) (*websocket.Conn, *batchConn, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		// Not the parser's error: it quotes the URL whole.
		return nil, nil, config.Usagef("--url %s is not a URL; e.g. wss://engine.example.com%s", logging.ShownURL(cfg.URL), config.AttachPath)
	}
	tlsConfig, err := cfg.TLSConfig()
	if err != nil {
		return nil, nil, &config.UsageError{Err: err}
	}
	q := u.Query()
	q.Set("token", cfg.Token)
	u.RawQuery = q.Encode()
	shown := logging.ShownURL(cfg.URL)
	tcp := &batchDialer{}
	dialer := websocket.Dialer{
		NetDialContext:   tcp.DialContext,
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: handshakeTimeout,
		ReadBufferSize:   64 << 10,
		WriteBufferSize:  64 << 10,
		TLSClientConfig:  tlsConfig,
	}
	header := http.Header{"Authorization": {"Bearer " + cfg.Token}}
	if offer > 0 {
		header.Set(protocol.ResumeHeader, protocol.ResumeOffer(offer))
	}
	ws, resp, err := dialer.DialContext(ctx, u.String(), header)
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			return nil, nil, &protocol.RefusedError{Reason: fmt.Sprintf("HTTP %s%s (check the token)", resp.Status, bodySnippet(resp))}
		}
		if resp != nil && resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.Header.Get("Location") != "" {
			// A WebSocket upgrade does not follow redirects (it would
			// carry the token wherever it points); say where it points.
			to := resp.Header.Get("Location")
			if loc, lerr := u.Parse(to); lerr == nil {
				to = loc.String()
			}
			return nil, nil, fmt.Errorf("connecting to %s: HTTP %s: the engine redirects to %s; if that is the engine's address, use it as --url", shown, resp.Status, logging.ShownURL(to))
		}
		if resp != nil {
			body := bodySnippet(resp)
			if resp.StatusCode == http.StatusBadRequest && u.Scheme == "ws" && strings.Contains(strings.ToUpper(body), "HTTPS") {
				// Go's, nginx's and Apache's answer to plain HTTP on a
				// TLS port: retrying would not change it, the URL is wrong.
				return nil, nil, speaksTLSError(u, shown)
			}
			return nil, nil, fmt.Errorf("connecting to %s: HTTP %s%s", shown, resp.Status, body)
		}
		if u.Scheme == "ws" && tcp.conn != nil && ctx.Err() == nil && speaksTLS(ctx, u) {
			// Connected, but no HTTP answer: any other TLS server (a
			// bare TLS listener, Python's ssl) closes, resets or sends
			// an alert, and the probe asks the port itself.
			return nil, nil, speaksTLSError(u, shown)
		}
		var plain tls.RecordHeaderError
		if errors.As(err, &plain) && u.Scheme == "wss" {
			// Retrying would not change it: the URL is wrong.
			port := u.Port()
			if port == "" {
				port = "443"
			}
			return nil, nil, config.Usagef("the server at %s does not speak TLS: use ws://%s in --url (wss:// is for an engine with TLS)",
				net.JoinHostPort(u.Hostname(), port), strings.TrimPrefix(shown, "wss://"))
		}
		return nil, nil, fmt.Errorf("connecting to %s: %w", shown, config.ExplainTLSError(err))
	}
	// No message-size limit: answers of tens of MiB are normal.
	ws.SetReadLimit(0)
	return ws, tcp.conn, nil
}

// speaksTLSError is the error for ws:// to a server that speaks TLS:
// retrying would not change it, the URL is wrong.
func speaksTLSError(u *url.URL, shown string) error {
	return config.Usagef("the server at %s speaks TLS: use wss://%s in --url (ws:// is for an engine without TLS)",
		u.Host, strings.TrimPrefix(shown, "ws://"))
}

func bodySnippet(resp *http.Response) string {
	if resp.Body == nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return ": " + s
}

// greet sends hello and waits for the welcome. Only an explicit answer
// other than a welcome (a JSON object whose "op" is another string, like
// {"op": "refused", "reason": "..."}) is a refusal; an answer that is not
// a JSON object with a string "op", or a welcome whose name is not a
// string, is a failed attempt, retried with backoff like a lost
// connection: an engine behind a misbehaving proxy, or mid-upgrade, must
// not stop the worker for good.
//
// It also returns the grace of the resume extension when the worker offered
// it (offered) and the welcome accepted it, else 0, and whether the welcome
// asked for acknowledged answers.
func greet(ws *websocket.Conn, hello protocol.Hello, offered bool) (name string, grace time.Duration, ack bool, err error) {
	b, _ := json.Marshal(hello)
	ws.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	if err := ws.WriteMessage(websocket.TextMessage, b); err != nil {
		return "", 0, false, fmt.Errorf("sending hello: %w", err)
	}
	ws.SetReadDeadline(time.Now().Add(handshakeTimeout))
	_, data, err := ws.ReadMessage()
	if err != nil {
		return "", 0, false, fmt.Errorf("waiting for the engine's welcome: %w", err)
	}
	name, err = protocol.ParseWelcome(data)
	if err != nil {
		return "", 0, false, err
	}
	if name == "" {
		name = hello.Name // an engine that does not say keeps ours
	}
	if offered {
		grace, ack = protocol.ResumeGrace(data), protocol.ResumeAck(data)
	}
	ws.SetWriteDeadline(time.Time{})
	return name, grace, ack, nil
}

// Attach dials the engine, says hello and waits for the welcome: the
// connection and the name the engine gave this worker. Its errors never
// show the token; a *protocol.RefusedError says the engine will not have
// this worker.
//
// It offers the resume extension with --outage-grace when that is not 0;
// the connection's ResumeGrace says whether the engine accepted.
func Attach(ctx context.Context, cfg config.Config, hello protocol.Hello) (*Conn, string, error) {
	ws, raw, err := dialScrubbed(ctx, cfg, cfg.OutageGrace)
	if err != nil {
		return nil, "", err
	}
	name, grace, ack, err := greet(ws, hello, cfg.OutageGrace > 0)
	if err != nil {
		ws.Close()
		return nil, "", ScrubError(cfg.Token, err)
	}
	c := newConn(ws, raw)
	c.resumeGrace = min(grace, cfg.OutageGrace)
	c.resumeAck = c.resumeGrace > 0 && ack
	return c, name, nil
}

// CheckAttach attaches and closes again at once: the check `install` and
// `check` make.
func CheckAttach(ctx context.Context, cfg config.Config, hello protocol.Hello) error {
	ws, _, err := dialScrubbed(ctx, cfg, 0)
	if err != nil {
		return err
	}
	defer ws.Close()
	if _, _, _, err := greet(ws, hello, false); err != nil {
		// Callers print it: the engine's reason may quote the token.
		return ScrubError(cfg.Token, err)
	}
	ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, "check done"), time.Now().Add(closeWait))
	return nil
}

// Conn is an attached connection. One goroutine, writeLoop, writes
// the socket; everyone else hands it frames through Send.
type Conn struct {
	ws      *websocket.Conn
	raw     *batchConn
	out     chan []byte
	closing chan struct{} // asks writeLoop for a clean close
	dead    chan struct{} // closed when the connection is finished
	once    sync.Once
	closeMu sync.Once

	resumeGrace time.Duration // the resume extension's grace, 0 when not in use
	resumeAck   bool          // with it, the engine acknowledges answers
}

// ResumeGrace is how long calls of this connection may be held through an
// outage: the lesser of --outage-grace and what the engine's welcome
// allowed; 0 when the extension is not in use on this connection.
func (c *Conn) ResumeGrace() time.Duration { return c.resumeGrace }

// ResumeAck says whether the engine acknowledges answers on this
// connection (the resume extension's option): a call's answer then waits
// for its acknowledgement.
func (c *Conn) ResumeAck() bool { return c.resumeAck }

func newConn(ws *websocket.Conn, raw *batchConn) *Conn {
	c := &Conn{
		ws:      ws,
		raw:     raw,
		out:     make(chan []byte, outboxSize),
		closing: make(chan struct{}),
		dead:    make(chan struct{}),
	}
	ws.SetPongHandler(func(string) error { c.extendRead(); return nil })
	// Control frames the reader answers (pong, close) go out at once.
	ws.SetPingHandler(func(data string) error {
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeTimeout))
		if err == nil {
			err = raw.Flush()
		}
		c.extendRead()
		return err
	})
	ws.SetCloseHandler(func(code int, _ string) error {
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(closeWait))
		raw.Flush()
		return nil
	})
	raw.batch()
	c.extendRead()
	go c.writeLoop()
	return c
}

// extendRead pushes the read deadline past the next ping's answer.
func (c *Conn) extendRead() {
	c.ws.SetReadDeadline(time.Now().Add(pingInterval + pongWait))
}

// Send queues one text frame, which then belongs to the writer (it may
// recycle it). It reports false once the connection is gone.
func (c *Conn) Send(frame []byte) bool {
	select {
	case c.out <- frame:
		return true
	case <-c.dead:
		return false
	}
}

// SendJSON marshals and queues v.
func (c *Conn) SendJSON(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return c.Send(b)
}

// Read returns the next message from the engine.
func (c *Conn) Read() ([]byte, error) {
	for {
		kind, data, err := c.ws.ReadMessage()
		if err != nil {
			c.Abort()
			return nil, err
		}
		c.extendRead()
		if kind == websocket.TextMessage || kind == websocket.BinaryMessage {
			return data, nil
		}
	}
}

func (c *Conn) writeLoop() {
	ping := time.NewTicker(pingInterval)
	defer ping.Stop()
	for {
		select {
		case frame := <-c.out:
			if err := c.writeBatch(frame); err != nil {
				c.Abort()
				return
			}
		case <-ping.C:
			err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeTimeout))
			if err == nil {
				err = c.raw.Flush()
			}
			if err != nil {
				c.Abort()
				return
			}
		case <-c.closing:
			c.flushAndClose()
			return
		case <-c.dead:
			return
		}
	}
}

// writeBatch writes msg and whatever else is already queued, then
// flushes them together.
func (c *Conn) writeBatch(msg []byte) error {
	c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	outsized := false
	for {
		outsized = outsized || len(msg) >= frame.Outsized
		err := c.ws.WriteMessage(websocket.TextMessage, msg)
		frame.Put(msg)
		msg = nil
		if err != nil {
			return err
		}
		select {
		case msg = <-c.out:
			continue
		default:
		}
		err = c.raw.Flush()
		if outsized {
			frame.Release() // an answer of many MiB is sent only now
		}
		return err
	}
}

// flushAndClose sends what is queued, then a close frame, and gives the
// engine closeWait to answer it before the socket is closed.
func (c *Conn) flushAndClose() {
	select {
	case frame := <-c.out:
		if c.writeBatch(frame) != nil {
			c.Abort()
			return
		}
	default:
	}
	msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "worker stopping")
	c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(closeWait))
	c.raw.Flush()
	select {
	case <-c.dead: // the reader saw the engine's close
	case <-time.After(closeWait):
		c.Abort()
	}
}

// Close closes the connection cleanly: queued frames first, then a close
// frame. It returns when the connection is finished.
func (c *Conn) Close() {
	c.closeMu.Do(func() { close(c.closing) })
	<-c.dead
}

// Abort tears the connection down; safe to call more than once.
func (c *Conn) Abort() {
	c.once.Do(func() {
		close(c.dead)
		c.ws.Close()
	})
}
