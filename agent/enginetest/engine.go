// Package enginetest is a fake Fluksio engine for tests, benchmarks and
// `fluksio-worker selftest`, in the spirit of net/http/httptest: it serves
// the worker endpoint (/api/v1/workers/attach) on loopback with token
// checks, welcomes or refuses workers, lets the caller send run, compile and
// cancel and read back each call's events and answer, serves the runner at
// /api/v1/workers/runtime, and keeps an in-memory content-addressed
// artifact store (PUT and GET /api/v1/artifacts/sha256:<hex>).
//
// It speaks agent/protocol's messages, so the fake and the worker share
// one declaration of each. selftest runs it, so it is compiled into the
// binary; nothing under test/ is (TestBinaryHasNoTestPackages checks that).
package enginetest

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// Options configure an Engine.
type Options struct {
	// Tokens accepted on attach, runtime and artifacts; a wrong one gets
	// HTTP 401. Empty accepts any non-empty token.
	Tokens []string
	// Refuse, when set, answers every hello with {"op": "refused", "reason": Refuse}.
	Refuse string
	// HelloAnswers, when set, answers the first hellos with these raw
	// frames, one each, and closes the connection: a hostile or broken
	// engine. Later hellos are answered as usual.
	HelloAnswers []string
	// Runtime is served at GET /api/v1/workers/runtime; nil answers 404.
	Runtime []byte
	// Addr to listen on; default 127.0.0.1:0.
	Addr string

	// Hostile modes, for the tests of what a worker does with them.

	// EchoStatus, when set, answers every attach with this HTTP status and
	// a page that echoes the request URL, query and all, as Express's
	// default error page does.
	EchoStatus int
	// RedirectTo, when set, answers every attach with 307 Temporary
	// Redirect to this location.
	RedirectTo string
	// TLS serves https and wss with a self-signed certificate for
	// 127.0.0.1 and localhost; CACertPEM is what to trust.
	TLS bool

	// Resume, when above 0, accepts the resume extension from workers that
	// offer it, allowing this grace (see resume.go).
	Resume time.Duration
	// ResumeAck, with Resume, asks for acknowledged answers: the engine
	// acknowledges each call's answer once it has read it.
	ResumeAck bool
}

// Engine is a running fake engine.
type Engine struct {
	opts Options
	addr string // set once by Start: Restart listens on it again

	workers chan *Worker

	tlsCert *tls.Certificate // with Options.TLS
	caPEM   []byte

	mu        sync.Mutex
	server    *http.Server // replaced by Restart
	conns     map[*Worker]struct{}
	artifacts map[string][]byte
	gets      map[string]int // GETs of each artifact, by digest
	hellos    []Hello
	attempts  *attempts // every attach request; see record.go
	resume    resumeState
}

// Start listens and serves until Close.
func Start(opts Options) (*Engine, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	e := &Engine{
		opts:      opts,
		workers:   make(chan *Worker, 64),
		conns:     map[*Worker]struct{}{},
		artifacts: map[string][]byte{},
	}
	if opts.TLS {
		cert, caPEM, err := selfSignedCert()
		if err != nil {
			return nil, err
		}
		e.tlsCert, e.caPEM = cert, caPEM
	}
	addr, err := e.listen(opts.Addr)
	if err != nil {
		return nil, err
	}
	e.addr = addr
	return e, nil
}

// listen serves on addr and returns the address it is bound to.
func (e *Engine) listen(addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/workers/attach", e.attach)
	mux.HandleFunc("GET /api/v1/workers/runtime", e.runtime)
	mux.HandleFunc("/api/v1/artifacts/", e.artifact)
	bound := l.Addr().String()
	if e.tlsCert != nil {
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{*e.tlsCert}})
	}
	srv := &http.Server{Handler: mux}
	e.mu.Lock()
	e.server = srv
	e.mu.Unlock()
	go srv.Serve(l)
	return bound, nil
}

// stopServing closes the listener and the HTTP server.
func (e *Engine) stopServing() {
	e.mu.Lock()
	srv := e.server
	e.mu.Unlock()
	srv.Close()
}

// Addr is host:port.
func (e *Engine) Addr() string { return e.addr }

// AttachURL is what a worker's --url should be.
func (e *Engine) AttachURL() string {
	if e.tlsCert != nil {
		return "wss://" + e.addr + "/api/v1/workers/attach"
	}
	return "ws://" + e.addr + "/api/v1/workers/attach"
}

// BaseURL is the engine's HTTP root.
func (e *Engine) BaseURL() string {
	if e.tlsCert != nil {
		return "https://" + e.addr
	}
	return "http://" + e.addr
}

// CACertPEM is the PEM certificate a client must trust to reach an engine
// started with Options.TLS; nil otherwise.
func (e *Engine) CACertPEM() []byte { return e.caPEM }

// Close stops the engine and drops every connection.
func (e *Engine) Close() {
	e.stopServing()
	e.DropAll()
}

// Restart simulates an engine restart: every connection dropped, nothing
// listening for down, then listening again on the same address.
func (e *Engine) Restart(down time.Duration) error {
	e.stopServing()
	e.DropAll()
	time.Sleep(down)
	_, err := e.listen(e.addr)
	return err
}

// DropAll closes every worker connection abruptly, without a close frame.
func (e *Engine) DropAll() {
	e.mu.Lock()
	conns := make([]*Worker, 0, len(e.conns))
	for w := range e.conns {
		conns = append(conns, w)
	}
	e.mu.Unlock()
	for _, w := range conns {
		w.Drop()
	}
}

// NextWorker waits for the next worker to be welcomed.
func (e *Engine) NextWorker(ctx context.Context) (*Worker, error) {
	select {
	case w := <-e.workers:
		return w, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("no worker attached: %w", ctx.Err())
	}
}

// Hellos returns every hello received, refused ones included.
func (e *Engine) Hellos() []Hello {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Hello(nil), e.hellos...)
}

func (e *Engine) tokenOK(token string) bool {
	if token == "" {
		return false
	}
	if len(e.opts.Tokens) == 0 {
		return true
	}
	for _, t := range e.opts.Tokens {
		if t == token {
			return true
		}
	}
	return false
}

func bearer(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

var upgrader = websocket.Upgrader{ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}

func (e *Engine) attach(w http.ResponseWriter, r *http.Request) {
	e.record().add(r)
	if e.opts.EchoStatus != 0 {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(e.opts.EchoStatus)
		fmt.Fprintf(w, "<!DOCTYPE html>\n<html><body><pre>Cannot %s %s</pre></body></html>\n", r.Method, r.RequestURI)
		return
	}
	if e.opts.RedirectTo != "" {
		http.Redirect(w, r, e.opts.RedirectTo, http.StatusTemporaryRedirect)
		return
	}
	if !e.tokenOK(r.URL.Query().Get("token")) {
		http.Error(w, "invalid worker token", http.StatusUnauthorized)
		return
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(0)
	ws.SetReadDeadline(time.Now().Add(time.Minute))
	_, data, err := ws.ReadMessage()
	if err != nil {
		ws.Close()
		return
	}
	var hello Hello
	if err := json.Unmarshal(data, &hello); err != nil || hello.Op != "hello" {
		ws.WriteJSON(map[string]any{"op": "refused", "reason": "expected hello"})
		ws.Close()
		return
	}
	hello.Raw = data
	e.mu.Lock()
	e.hellos = append(e.hellos, hello)
	odd := ""
	if n := len(e.hellos); n <= len(e.opts.HelloAnswers) {
		odd = e.opts.HelloAnswers[n-1]
	}
	e.mu.Unlock()
	if odd != "" {
		ws.WriteMessage(websocket.TextMessage, []byte(odd))
		ws.Close()
		return
	}
	if e.opts.Refuse != "" {
		ws.WriteJSON(map[string]any{"op": "refused", "reason": e.opts.Refuse})
		ws.Close()
		return
	}
	ws.SetReadDeadline(time.Time{})
	welcome := map[string]any{"op": protocol.OpWelcome, "name": hello.Name}
	resume := e.acceptResume(r, welcome)
	if err := ws.WriteJSON(welcome); err != nil {
		ws.Close()
		return
	}
	var resumer *Engine
	if resume {
		resumer = e
	}
	wk := newWorker(ws, hello, resumer)
	e.mu.Lock()
	e.conns[wk] = struct{}{}
	e.mu.Unlock()
	go func() {
		<-wk.Done()
		e.mu.Lock()
		delete(e.conns, wk)
		e.mu.Unlock()
	}()
	e.workers <- wk
}

func (e *Engine) runtime(w http.ResponseWriter, r *http.Request) {
	if !e.tokenOK(bearer(r)) {
		http.Error(w, "invalid worker token", http.StatusUnauthorized)
		return
	}
	if e.opts.Runtime == nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/x-python")
	w.Write(e.opts.Runtime)
}

// artifact serves the content-addressed store. A PUT whose bytes do not
// hash to the digest in its path is refused, as a real store would.
func (e *Engine) artifact(w http.ResponseWriter, r *http.Request) {
	if !e.tokenOK(bearer(r)) {
		http.Error(w, "invalid worker token", http.StatusUnauthorized)
		return
	}
	digest := strings.TrimPrefix(r.URL.Path, "/api/v1/artifacts/")
	if !strings.HasPrefix(digest, "sha256:") || len(digest) != len("sha256:")+64 {
		http.Error(w, "expected /api/v1/artifacts/sha256:<64 hex>", http.StatusBadRequest)
		return
	}
	switch r.Method {
	case http.MethodPut:
		h := sha256.New()
		body, err := io.ReadAll(io.TeeReader(r.Body, h))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
			http.Error(w, "content does not match digest "+digest+" (got "+got+")", http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.artifacts[digest] = body
		e.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	case http.MethodGet, http.MethodHead:
		e.mu.Lock()
		body, ok := e.artifacts[digest]
		if ok && r.Method == http.MethodGet {
			if e.gets == nil {
				e.gets = map[string]int{}
			}
			e.gets[digest]++
		}
		e.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		if r.Method == http.MethodGet {
			w.Write(body)
		}
	default:
		http.Error(w, "PUT or GET", http.StatusMethodNotAllowed)
	}
}

// Artifact returns a stored artifact by digest ("sha256:<hex>").
func (e *Engine) Artifact(digest string) ([]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, ok := e.artifacts[digest]
	return b, ok
}

// ArtifactGets says how many times the artifact digest was fetched.
func (e *Engine) ArtifactGets(digest string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gets[digest]
}

// PutArtifact stores data and returns its digest.
func (e *Engine) PutArtifact(data []byte) string {
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	e.mu.Lock()
	e.artifacts[digest] = data
	e.mu.Unlock()
	return digest
}

// ErrClosed is returned by a Worker whose connection has ended.
var ErrClosed = errors.New("the worker's connection is closed")
