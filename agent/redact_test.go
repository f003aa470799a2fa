package agent

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
	cfg := Config{URL: "ws://h", Token: "short"}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "shorter than 8") {
		t.Errorf("warnings %q", cfg.Warnings)
	}
}

func TestShownURL(t *testing.T) {
	for in, want := range map[string]string{
		"wss://u:p@h:1/x?token=t#f": "wss://h:1/x",
		"wss://h":                   "wss://h",
		"not a url?token=t":         "not a url",
		"ws://h/x\x7f?token=t":      "ws://h/x\x7f",
	} {
		if got := ShownURL(in); got != want {
			t.Errorf("ShownURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// Numbers past what anyone can mean are refused with the limit.
func TestOptionLimits(t *testing.T) {
	for name, v := range map[string]string{
		"max-idle": "1e10", "cancel-grace": "1e300", "max-line": "9999999999999GiB",
		"parallel": "100000", "cpus": "99999999999", "gpus": "5000", "ram-mb": "99999999999",
	} {
		o, _ := OptionByName(name)
		err := o.Check(v)
		if err == nil || !(strings.Contains(err.Error(), "at most") || strings.Contains(err.Error(), "too large")) {
			t.Errorf("--%s %s: %v", name, v, err)
		}
	}
	for name, v := range map[string]string{"max-idle": "8760h", "cancel-grace": "30m", "max-line": "1GiB", "parallel": "64", "cpus": "256"} {
		o, _ := OptionByName(name)
		if err := o.Check(v); err != nil {
			t.Errorf("--%s %s: %v", name, v, err)
		}
	}
}
