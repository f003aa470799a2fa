package engine

import (
	"bufio"
	"context"
	"net"
	"sync"
	"time"
)

// batchConn lets the socket's single writer put many frames into one
// write(2): gorilla/websocket writes every frame straight to its net.Conn,
// which at tens of thousands of events a second would be one system call
// each. Writes are buffered once batching is switched on (after the
// handshake, which must go out as it is written) and leave on Flush.
//
// gorilla/websocket also sets the write deadline before every frame; while
// batching, the deadline is kept here and given to the socket only before
// the buffer goes out to it: a timer reset a write(2), not one a frame (a
// tenth of the worker's CPU relaying a chatty call).
type batchConn struct {
	net.Conn
	mu       sync.Mutex
	w        *bufio.Writer
	batched  bool
	deadline time.Time // the write deadline last set
	stale    bool      // deadline is not the socket's yet
}

// batchSize is the most that waits in the buffer before a write.
const batchSize = 64 << 10

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.batched {
		return c.Conn.Write(p)
	}
	if len(p) > c.w.Available() { // the buffer goes out to make room
		if err := c.deadlineLocked(); err != nil {
			return 0, err
		}
	}
	return c.w.Write(p)
}

// Flush sends what is buffered.
func (c *batchConn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.deadlineLocked(); err != nil {
		return err
	}
	return c.w.Flush()
}

// SetWriteDeadline sets the deadline of the writes to the socket: at once
// before batching, and once batching, before the buffer next goes out.
func (c *batchConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.batched {
		return c.Conn.SetWriteDeadline(t)
	}
	c.deadline, c.stale = t, true
	return nil
}

// deadlineLocked gives the socket the deadline last set, if it has not.
func (c *batchConn) deadlineLocked() error {
	if !c.stale {
		return nil
	}
	c.stale = false
	return c.Conn.SetWriteDeadline(c.deadline)
}

// batch switches buffering on.
func (c *batchConn) batch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batched = true
}

// batchDialer dials TCP and remembers the batchConn it made, so the session
// can flush it. TLS, when the URL asks for it, is layered on top by the
// websocket dialer, so TLS records are what gets batched.
type batchDialer struct {
	net.Dialer
	conn *batchConn
}

func (d *batchDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := d.Dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.conn = &batchConn{Conn: conn}
	d.conn.w = bufio.NewWriterSize(conn, batchSize)
	return d.conn, nil
}
