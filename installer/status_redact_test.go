package installer

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/status"
)

// A last error that quotes an engine's page echoing the request URL (as a
// status file from an older worker may) is shown without the token.
func TestStatusHidesATokenInTheLastError(t *testing.T) {
	l, _ := layoutFor("linux", false, dirs{})
	st := status.Status{State: "connecting",
		LastError: "connecting to wss://e/api/v1/workers/attach: HTTP 404 Not Found: <pre>Cannot GET /api/v1/workers/attach?token=tok%2Ben%2Fs3cret</pre>"}
	var out bytes.Buffer
	writeStatus(&out, l, Running, st, nil)
	if text := out.String(); strings.Contains(text, "s3cret") || !strings.Contains(text, "token=REDACTED") {
		t.Errorf("status:\n%s", text)
	}
}
