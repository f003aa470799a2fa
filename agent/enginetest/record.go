package enginetest

// What a real engine would see of a worker, recorded for tests to assert
// on: each attach attempt (when it came, its upgrade request's headers and
// URL), the pings a worker sends, and the close frame it ends with. A
// Doorman records attempts without ever welcoming anyone: a listener that
// hangs up or answers an HTTP status, for backoff and refusal tests.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Attempt is one attach request as the engine received it.
type Attempt struct {
	At     time.Time
	Header http.Header
	URL    *url.URL
}

// attempts is a list of attempts that can be waited on.
type attempts struct {
	mu      sync.Mutex
	list    []Attempt
	changed chan struct{} // closed and replaced at each new attempt
}

func (a *attempts) add(r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.list = append(a.list, Attempt{At: time.Now(), Header: r.Header.Clone(), URL: r.URL})
	if a.changed != nil {
		close(a.changed)
	}
	a.changed = make(chan struct{})
}

func (a *attempts) snapshot() ([]Attempt, chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.changed == nil {
		a.changed = make(chan struct{})
	}
	return append([]Attempt(nil), a.list...), a.changed
}

// wait returns the attempts once there are at least n.
func (a *attempts) wait(ctx context.Context, n int) ([]Attempt, error) {
	for {
		list, changed := a.snapshot()
		if len(list) >= n {
			return list, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return list, fmt.Errorf("%d attach attempts, waiting for %d: %w", len(list), n, ctx.Err())
		}
	}
}

// Attempts returns every attach request the engine received, refused
// ones included, in order.
func (e *Engine) Attempts() []Attempt {
	list, _ := e.record().snapshot()
	return list
}

func (e *Engine) record() *attempts {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.attempts == nil {
		e.attempts = &attempts{}
	}
	return e.attempts
}

// Doorman listens where a worker's --url points and records each attach
// attempt, but never lets one in: it hangs up at once (Status 0, what an
// engine's load balancer does while the engine restarts) or answers an
// HTTP status (401 and 403 are refusals).
type Doorman struct {
	Status int

	server   *http.Server
	addr     string
	attempts attempts
}

// StartDoorman listens on a loopback port.
func StartDoorman(status int) (*Doorman, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &Doorman{Status: status, addr: l.Addr().String()}
	d.server = &http.Server{Handler: http.HandlerFunc(d.serve)}
	go d.server.Serve(l)
	return d, nil
}

func (d *Doorman) serve(w http.ResponseWriter, r *http.Request) {
	d.attempts.add(r)
	if d.Status != 0 {
		http.Error(w, http.StatusText(d.Status), d.Status)
		return
	}
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

// AttachURL is what a worker's --url should be.
func (d *Doorman) AttachURL() string { return "ws://" + d.addr + "/api/v1/workers/attach" }

// Attempts returns the attach attempts so far.
func (d *Doorman) Attempts() []Attempt {
	list, _ := d.attempts.snapshot()
	return list
}

// WaitAttempts returns the attempts once there are at least n.
func (d *Doorman) WaitAttempts(ctx context.Context, n int) ([]Attempt, error) {
	return d.attempts.wait(ctx, n)
}

// Close stops listening.
func (d *Doorman) Close() { d.server.Close() }

// control records a worker's control frames: the pings it sends and the
// close frame it ends the connection with.
type control struct {
	mu        sync.Mutex
	pings     []time.Time
	closeCode int // 0 until a close frame arrived
	closeText string
	pinged    chan struct{} // closed and replaced at each ping
}

// watchControl wraps the worker's ping and close handlers so that what
// they receive is recorded; they still answer as before.
func (w *Worker) watchControl() {
	w.control = &control{pinged: make(chan struct{})}
	ping, closeH := w.ws.PingHandler(), w.ws.CloseHandler()
	w.ws.SetPingHandler(func(data string) error {
		c := w.control
		c.mu.Lock()
		c.pings = append(c.pings, time.Now())
		close(c.pinged)
		c.pinged = make(chan struct{})
		c.mu.Unlock()
		return ping(data)
	})
	w.ws.SetCloseHandler(func(code int, text string) error {
		c := w.control
		c.mu.Lock()
		c.closeCode, c.closeText = code, text
		c.mu.Unlock()
		return closeH(code, text)
	})
}

// Pings returns when each ping from the worker arrived.
func (w *Worker) Pings() []time.Time {
	w.control.mu.Lock()
	defer w.control.mu.Unlock()
	return append([]time.Time(nil), w.control.pings...)
}

// WaitPings returns the pings' arrival times once there are at least n.
func (w *Worker) WaitPings(ctx context.Context, n int) ([]time.Time, error) {
	for {
		c := w.control
		c.mu.Lock()
		pings, pinged := append([]time.Time(nil), c.pings...), c.pinged
		c.mu.Unlock()
		if len(pings) >= n {
			return pings, nil
		}
		select {
		case <-pinged:
		case <-w.done:
			return pings, fmt.Errorf("%d pings, waiting for %d: %w", len(pings), n, ErrClosed)
		case <-ctx.Done():
			return pings, fmt.Errorf("%d pings, waiting for %d: %w", len(pings), n, ctx.Err())
		}
	}
}

// CloseFrame returns the code and text of the close frame the worker sent;
// code 0 means it sent none (the connection just ended, or has not).
func (w *Worker) CloseFrame() (code int, text string) {
	w.control.mu.Lock()
	defer w.control.mu.Unlock()
	return w.control.closeCode, w.control.closeText
}

// CloseNormal is the close code of a clean, intended close (RFC 6455).
const CloseNormal = websocket.CloseNormalClosure
