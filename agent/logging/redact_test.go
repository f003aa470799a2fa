package logging

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
)

// Every form the token takes in text others wrote is replaced: raw, URL
// query and path escaped (either hex case), JSON escaped; and token=
// parameters whatever their value.
func TestRedactorForms(t *testing.T) {
	const token = `tok+en/with=b64<&>"x`
	r := NewRedactor(token)
	j, _ := json.Marshal(token)
	for _, text := range []string{
		token,
		url.QueryEscape(token),
		strings.ToLower(url.QueryEscape(token)),
		strings.ReplaceAll(url.QueryEscape(token), "+", "%20"),
		url.PathEscape(token),
		string(j),
		`{"error": "bad token ` + strings.Trim(string(j), `"`) + `"}`,
		"<pre>Cannot GET /api/v1/workers/attach?token=" + url.QueryEscape(token) + "</pre>",
	} {
		got := r.Scrub("before " + text + " after")
		if strings.Contains(got, "tok+en") || strings.Contains(got, "tok%2B") || strings.Contains(got, "tok%2b") || !strings.Contains(got, Redacted) {
			t.Errorf("Scrub(%q) = %q", text, got)
		}
	}
	// Any token= parameter, even of another token, and without a redactor.
	var none *Redactor
	if got := none.Scrub("GET /x?a=1&token=abc123&b=2"); got != "GET /x?a=1&token=REDACTED&b=2" {
		t.Errorf("token= parameter: %q", got)
	}
}

// A token shorter than MinRedactLen is not searched for in free text: a
// one-letter token would otherwise replace every such letter.
func TestShortTokenIsNotSearchedFor(t *testing.T) {
	r := NewRedactor("e")
	if got := r.Scrub("attached to the engine"); got != "attached to the engine" {
		t.Errorf("Scrub mangled ordinary text: %q", got)
	}
}

func TestShownURL(t *testing.T) {
	for in, want := range map[string]string{
		"wss://u:p@h:1/x?token=t#f": "wss://u:REDACTED@h:1/x",
		"wss://h":                   "wss://h",
		"not a url?token=t":         "not a url",
		"ws://h/x\x7f?token=t":      "ws://h/x\x7f",
	} {
		if got := ShownURL(in); got != want {
			t.Errorf("ShownURL(%q) = %q, want %q", in, got, want)
		}
	}
}
