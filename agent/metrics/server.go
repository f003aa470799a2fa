package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Health says whether the worker is well, with a one-line reason.
type Health func() (ok bool, reason string)

// Limits of the monitoring endpoint. It serves a scraper and a probe, not
// the public: a client that dawdles over its request is cut off, and a
// handful of scrapes at once is plenty.
const (
	writeTimeout        = 30 * time.Second
	maxScrapesInFlight  = 4
	shutdownGracePeriod = time.Second
)

// connLimits bound what connections may hold: each open one costs the
// worker a file descriptor, which its calls need for their pipes, so an
// idle or slow client is let go and the number open at once is capped.
type connLimits struct {
	// idle: a keep-alive connection waiting for its next request. A
	// scraper comes back every 15 to 60 s and reconnects cheaply.
	idle time.Duration
	// header: a request's headers, from the connection's start or the
	// end of the previous request; read: a whole request, headers and
	// body (the endpoint takes none).
	header, read time.Duration
	// maxConns open at once; one more takes the place of the one that
	// waited longest for a request, or is closed as soon as it is
	// accepted when all are in one.
	// Prometheus, a probe and a person with curl need a few.
	maxConns int
}

var defaultLimits = connLimits{idle: 30 * time.Second, header: 5 * time.Second, read: 10 * time.Second, maxConns: 32}

// Server is the monitoring endpoint: GET or HEAD /metrics, /healthz (ready:
// attached, or within the grace) and /livez (alive: the worker's main loop
// runs, whatever the engine does).
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Listen binds addr (host:port; port 0 picks one) and serves in the
// background until Close. It fails at once when the address cannot be
// bound, so a typo is a configuration error, not a silent lack of metrics.
// The HTTP server's own complaints go to log at WARN.
func Listen(addr string, m *Metrics, health, live Health, log *slog.Logger) (*Server, error) {
	return listen(addr, m, health, live, log, defaultLimits)
}

func listen(addr string, m *Metrics, health, live Health, log *slog.Logger, lim connLimits) (*Server, error) {
	tcp, err := bind(addr)
	if err != nil {
		return nil, err
	}
	return serve(tcp, m, health, live, log, lim), nil
}

// CheckListen says whether addr can be bound now, as Listen binds it, and
// lets it go again: `check-config` asks it so that a reload to a port
// another program holds is refused while the old worker still serves.
func CheckListen(addr string) error {
	ln, err := bind(addr)
	if err != nil {
		return err
	}
	return ln.Close()
}

func bind(addr string) (net.Listener, error) {
	network, err := listenNetwork(addr)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
	tcp, err := net.Listen(network, addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("--listen %s: %w: another program holds this port (`ss -ltnp` shows which); stop it or choose another --listen", addr, err)
	}
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
	return tcp, nil
}

func serve(tcp net.Listener, m *Metrics, health, live Health, log *slog.Logger, lim connLimits) *Server {
	ln := newCappedListener(tcp, lim.maxConns)
	mux := http.NewServeMux()
	mux.Handle("/metrics", readOnly(promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{
		Registry:            m.Registry(), // counts its own errors there
		MaxRequestsInFlight: maxScrapesInFlight,
	})))
	mux.Handle("/healthz", readOnly(probe(health)))
	mux.Handle("/livez", readOnly(probe(live)))
	s := &Server{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: lim.header,
			ReadTimeout:       lim.read,
			WriteTimeout:      writeTimeout,
			IdleTimeout:       lim.idle,
			ConnState:         ln.track,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		ln:   ln,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			// Serve only fails when the listener does; nothing to do but stop.
			ln.Close()
		}
	}()
	return s
}

// Addr is the address bound, with the port chosen when addr asked for 0.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving, letting a scrape in progress finish briefly.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGracePeriod)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		s.srv.Close()
	}
	<-s.done
}

// listenNetwork is the family addr names: an IPv4 address (0.0.0.0
// included) listens on IPv4 only, an IPv6 one on IPv6 only, so that a
// firewall written for one family is not bypassed through the other. A
// name or an empty host listens as the system resolves it.
func listenNetwork(addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return "tcp", nil
	case ip.To4() != nil:
		return "tcp4", nil
	default:
		return "tcp6", nil
	}
}

// Exposure says to whom addr opens the port beyond this machine: "" for
// loopback only, else a phrase naming the network.
func Exposure(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "localhost" {
		return ""
	}
	ip := net.ParseIP(host)
	switch {
	case host == "" || (ip != nil && ip.IsUnspecified()):
		return "every network this machine is on"
	case ip != nil && ip.IsLoopback():
		return ""
	default:
		return "the network of " + host
	}
}

// cappedListener holds at most max connections open at once, so a client
// holding many open costs the worker nothing past the cap, and the
// kernel's queue of connections waiting to be accepted never fills. At the
// cap, a new connection takes the place of the one that has waited longest
// for a request (idle between two, or silent since it connected):
// keep-alive clients that ask now and then, or connections opened and left
// silent, must not lock out a probe, which the kubelet answers by
// restarting the worker. A probe sends its request as it connects, so it
// is the newest to wait and the last to go. When every connection is in a
// request, the new one is closed at once.
type cappedListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[*cappedConn]struct{}
}

func newCappedListener(ln net.Listener, max int) *cappedListener {
	return &cappedListener{Listener: ln, max: max, open: make(map[*cappedConn]struct{})}
}

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		var longest *cappedConn
		if len(l.open) >= l.max {
			for o := range l.open {
				if !o.waitingSince.IsZero() && (longest == nil || o.waitingSince.Before(longest.waitingSince)) {
					longest = o
				}
			}
			if longest == nil {
				l.mu.Unlock()
				c.Close()
				continue
			}
			delete(l.open, longest)
		}
		cc := &cappedConn{Conn: c, l: l, waitingSince: time.Now()}
		l.open[cc] = struct{}{}
		l.mu.Unlock()
		if longest != nil {
			// Its server goroutine, waiting for a request, sees the
			// close and lets the connection go.
			longest.Conn.Close()
		}
		return cc, nil
	}
}

// track is the server's ConnState hook: it notes when each connection
// starts waiting for its next request, and when one is being served.
func (l *cappedListener) track(c net.Conn, state http.ConnState) {
	cc, ok := c.(*cappedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateNew: // waiting since accepted
	case http.StateIdle:
		cc.waitingSince = time.Now()
	default:
		cc.waitingSince = time.Time{}
	}
}

type cappedConn struct {
	net.Conn
	l            *cappedListener
	waitingSince time.Time // zero while a request is served; guarded by l.mu
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	delete(c.l.open, c)
	c.l.mu.Unlock()
	return err
}

// probe answers 200 or 503, as h says, with h's reason as the body.
func probe(h Health) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, reason := h()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		if r.Method != http.MethodHead {
			fmt.Fprintln(w, reason)
		}
	})
}

// readOnly answers 405 to anything but GET and HEAD: the endpoint changes
// nothing, and says so.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: use GET or HEAD", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}
