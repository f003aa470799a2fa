package engine

// What the upgrade answers that the fake engine does not give, from plain
// HTTP servers on loopback: each status class and its error, the body
// quoted, a relative redirect resolved, wss:// against a server without
// TLS, and the upgrade's own headers.

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/gorilla/websocket"
)

// answering is a server that answers every request with status, these
// headers and body.
func answering(t *testing.T, status int, header map[string]string, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestUpgradeAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		status  int
		header  map[string]string
		body    string
		refused bool
		want    string // the whole error after "connecting to URL: ", or the refusal's reason
	}{
		{name: "forbidden", status: 403, body: "worker banned\n", refused: true, want: "HTTP 403 Forbidden: worker banned (check the token)"},
		{name: "unauthorized without a body", status: 401, refused: true, want: "HTTP 401 Unauthorized (check the token)"},
		{name: "server error", status: 500, body: "  ", want: "HTTP 500 Internal Server Error"},
		{name: "the first redirect status", status: 300, header: map[string]string{"Location": "/v2/attach"}, want: "HTTP 300 Multiple Choices: the engine redirects to ws://ADDR/v2/attach; if that is the engine's address, use it as --url"},
		{name: "a redirect without where", status: 302, want: "HTTP 302 Found"},
		{name: "not a redirect", status: 400, header: map[string]string{"Location": "/v2/attach"}, body: "bad", want: "HTTP 400 Bad Request: bad"},
		{name: "the last redirect status", status: 399, header: map[string]string{"Location": "ws://[::1"}, want: "HTTP 399 status code 399: the engine redirects to ws://[::1; if that is the engine's address, use it as --url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := answering(t, tc.status, tc.header, tc.body)
			url := "ws://" + addr + "/api/v1/workers/attach"
			refused, err := attachFails(t, url, tc.refused)
			switch {
			case tc.refused && refused.Reason != tc.want:
				t.Errorf("refused because %q; want %q", refused.Reason, tc.want)
			case !tc.refused && err.Error() != "connecting to "+url+": "+strings.ReplaceAll(tc.want, "ADDR", addr):
				t.Errorf("error %q; want %q", err, "connecting to "+url+": "+strings.ReplaceAll(tc.want, "ADDR", addr))
			}
		})
	}
}

// wss:// against a server without TLS is a wrong URL, not an outage.
func TestWSSAgainstPlainHTTP(t *testing.T) {
	t.Parallel()
	addr := answering(t, 200, nil, "")
	_, _, err := Attach(ctx(t), configFor("wss://"+addr+"/api/v1/workers/attach"), hello("w"))
	var usage *config.UsageError
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), "the server at "+addr+" does not speak TLS: use ws://"+addr+"/api/v1/workers/attach in --url") {
		t.Errorf("wss:// against plain HTTP: %v; want a usage error saying to use ws://", err)
	}
}

// ws:// against a server with TLS is a wrong URL too: the server's 400
// says so, and the error says the URL to use.
func TestWSAgainstTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "https://")
	_, _, err := Attach(ctx(t), configFor("ws://"+addr+"/api/v1/workers/attach"), hello("w"))
	var usage *config.UsageError
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), "the server at "+addr+" speaks TLS: use wss://"+addr+"/api/v1/workers/attach in --url") {
		t.Errorf("ws:// against TLS: %v; want a usage error saying to use wss://", err)
	}
}

// The resume extension is offered on the upgrade only with an
// --outage-grace, and only then is an accepting welcome taken at its
// word; a welcome without a name keeps the hello's.
func TestResumeOfferAndWelcomeName(t *testing.T) {
	t.Parallel()
	offers := make(chan string, 1)
	upgrader := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offers <- r.Header.Get(protocol.ResumeHeader)
		ws, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		if _, _, err := ws.ReadMessage(); err != nil {
			return
		}
		ws.WriteMessage(websocket.TextMessage, []byte(`{"op":"welcome","resume":{"version":1,"grace":60}}`))
		ws.ReadMessage() // until the worker closes
	}))
	t.Cleanup(srv.Close)
	url := "ws://" + strings.TrimPrefix(srv.URL, "http://") + "/api/v1/workers/attach"
	for _, grace := range []time.Duration{0, 90 * time.Second} {
		cfg := configFor(url)
		cfg.OutageGrace = grace
		conn, name, err := Attach(ctx(t), cfg, hello("hello-name"))
		if err != nil {
			t.Fatalf("--outage-grace %s: %v", grace, err)
		}
		offer, accepted := <-offers, conn.ResumeGrace()
		conn.Abort() // nothing reads here to see a clean close through
		if name != "hello-name" {
			t.Errorf("a welcome without a name: attached as %q, want the hello's", name)
		}
		switch {
		case grace == 0 && (offer != "" || accepted != 0):
			t.Errorf("--outage-grace 0: offered %q, accepted grace %s; want no offer and none accepted", offer, accepted)
		case grace > 0 && (offer != protocol.ResumeOffer(grace) || accepted != 60*time.Second):
			t.Errorf("--outage-grace %s: offered %q, accepted grace %s; want %q and 1m0s", grace, offer, accepted, protocol.ResumeOffer(grace))
		}
	}
}
