package engine

// ws:// to a server that speaks TLS but not HTTP over it, as real servers
// answer a plain request on a TLS port: a bare crypto/tls listener closes,
// Python's ssl (OpenSSL, and so Python's websockets) resets, another sends
// an alert record. Each is a wrong URL, said with the wss:// one to use;
// a server that closes without TLS stays an outage, tried again.

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// selfSigned makes a certificate for 127.0.0.1, also written as PEM
// files (cert.pem, key.pem) under dir for servers of other languages.
func selfSigned(t *testing.T, dir string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// serve accepts on a loopback port until the test ends, handing each
// connection to handle, and returns the address.
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// pythonTLSServer starts Python's ssl module serving TLS (and nothing over
// it) on a loopback port, and returns the address.
func pythonTLSServer(t *testing.T, dir string) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 here")
	}
	const script = `
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print("%s:%d" % s.getsockname(), flush=True)
while True:
    c, _ = s.accept()
    try:
        ctx.wrap_socket(c, server_side=True).close()
    except (ssl.SSLError, OSError):
        c.close()
`
	cmd := exec.Command(python, "-c", script, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("python's TLS server did not start: %v", err)
	}
	return strings.TrimSpace(addr)
}

func TestWSAgainstTLSWithoutHTTP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert := selfSigned(t, dir)
	for _, tc := range []struct {
		name   string
		server func(t *testing.T) string
	}{
		{"a crypto/tls listener, which closes", func(t *testing.T) string {
			return serve(t, func(c net.Conn) {
				tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake()
			})
		}},
		{"python's ssl, which resets", func(t *testing.T) string { return pythonTLSServer(t, dir) }},
		{"a server that answers with an alert record", func(t *testing.T) string {
			return serve(t, func(c net.Conn) {
				c.Read(make([]byte, 512))
				// handshake_failure, fatal, TLS 1.2.
				c.Write([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28})
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := tc.server(t)
			_, _, err := Attach(ctx(t), configFor("ws://"+addr+"/api/v1/workers/attach"), hello("w"))
			var usage *config.UsageError
			if !errors.As(err, &usage) || !strings.Contains(err.Error(), "the server at "+addr+" speaks TLS: use wss://"+addr+"/api/v1/workers/attach in --url") {
				t.Errorf("ws:// against TLS: %v; want a usage error saying to use wss://", err)
			}
		})
	}
}

// A server that takes the request and closes without a word, TLS or
// HTTP, may be an engine restarting: tried again, not a wrong URL.
func TestWSAgainstAServerThatClosesIsNotTLS(t *testing.T) {
	t.Parallel()
	addr := serve(t, func(c net.Conn) { c.Read(make([]byte, 512)) })
	_, _, err := Attach(ctx(t), configFor("ws://"+addr+"/api/v1/workers/attach"), hello("w"))
	var usage *config.UsageError
	if err == nil || errors.As(err, &usage) || !errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "EOF") {
		t.Errorf("ws:// against a server that closes: %v; want the connection's own error, to be tried again", err)
	}
}
