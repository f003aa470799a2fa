package engine

import (
	"bufio"
	"context"
	"net"
	"sync"
)

// batchConn lets the socket's single writer put many frames into one
// write(2): gorilla/websocket writes every frame straight to its net.Conn,
// which at tens of thousands of events a second would be one system call
// each. Writes are buffered once batching is switched on (after the
// handshake, which must go out as it is written) and leave on Flush.
type batchConn struct {
	net.Conn
	mu      sync.Mutex
	w       *bufio.Writer
	batched bool
}

// batchSize is the most that waits in the buffer before a write.
const batchSize = 64 << 10

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.batched {
		return c.Conn.Write(p)
	}
	return c.w.Write(p)
}

// Flush sends what is buffered.
func (c *batchConn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Flush()
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
