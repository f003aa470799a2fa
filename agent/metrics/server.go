package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Health says whether the worker is well, with a one-line reason.
type Health func() (ok bool, reason string)

// Limits of the monitoring endpoint. It serves a scraper and a probe, not
// the public: a client that dawdles over its request is cut off, and a
// handful of scrapes at once is plenty.
const (
	readHeaderTimeout   = 5 * time.Second
	writeTimeout        = 30 * time.Second
	maxScrapesInFlight  = 4
	shutdownGracePeriod = time.Second
)

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
func Listen(addr string, m *Metrics, health, live Health) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
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
			ReadHeaderTimeout: readHeaderTimeout,
			WriteTimeout:      writeTimeout,
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
	return s, nil
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
