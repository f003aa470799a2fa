package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"time"
)

// tlsProbeTimeout bounds the ClientHello sent to tell a TLS port from a
// server that is merely down: long enough for a loaded engine to answer a
// handshake, short enough that a failed attempt is not held up much.
const tlsProbeTimeout = 5 * time.Second

// speaksTLS says whether the server at u (a ws:// URL whose upgrade got no
// HTTP answer) speaks TLS, by sending it a TLS ClientHello. Servers answer
// a plain request on a TLS port differently: Go's and nginx's HTTP servers
// with a 400 that says HTTPS (dial reads that first), a bare crypto/tls
// listener by closing the connection, OpenSSL (Python's ssl, and so
// Python's websockets) by a reset, others by an alert record. None of
// these says "TLS" in a way the upgrade's error carries, so the port is
// asked in its own language. Any TLS answer counts: a handshake that
// completes, or an alert in answer (a server that wants a client certificate). Not
// verified, and closed at once: nothing is sent over it. Through a proxy
// it would ask the proxy's port, not the engine's, so it is not asked.
func speaksTLS(ctx context.Context, u *url.URL) bool {
	if proxy, err := http.ProxyFromEnvironment(&http.Request{URL: &url.URL{Scheme: "http", Host: u.Host}}); err != nil || proxy != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, tlsProbeTimeout)
	defer cancel()
	port := u.Port()
	if port == "" {
		port = "80"
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return false
	}
	defer conn.Close()
	// The probe's only question is whether TLS answers, not whose
	// certificate it is: a wss:// dial verifies it as usual.
	tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname(), InsecureSkipVerify: true})
	err = tc.HandshakeContext(ctx)
	// A received alert is a "remote error" (its type is crypto/tls's own).
	var remote *net.OpError
	return err == nil || errors.As(err, &remote) && remote.Op == "remote error"
}
