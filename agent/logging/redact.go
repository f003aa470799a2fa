package logging

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"sort"
	"strings"
)

// Redacted replaces the token wherever it appears in text the worker writes.
const Redacted = "REDACTED"

// MinRedactLen is the shortest token the worker looks for in free text.
// Redaction replaces every occurrence, so a token of a few characters would
// turn ordinary words into REDACTED (a one-letter token, every "e") and
// make the logs useless; a real engine issues tokens far longer than this.
// A shorter token is still kept out of every URL and header the worker
// shows (token= parameters are always replaced), and the worker warns at
// start that it cannot hide it elsewhere.
const MinRedactLen = 8

// tokenParam is a token query parameter in any text (an engine's error page
// echoing the request URL, say), whether or not its value is this worker's
// token: the value ends at a separator, a blank, a quote or markup.
var tokenParam = regexp.MustCompile(`(?i)([?&;]token=)[^&;\s"'<>#\\]*`)

// Redactor replaces the token in text: the raw token and the forms it takes
// in the places text comes from, URL query and path escaping (with upper or
// lower case hex) and JSON string escaping.
type Redactor struct {
	forms []string // longest first, so a form is not cut by a shorter one
}

// NewRedactor prepares the forms of token; a token shorter than
// MinRedactLen is not looked for in free text (see MinRedactLen).
func NewRedactor(token string) *Redactor {
	r := &Redactor{}
	if len(token) < MinRedactLen {
		return r
	}
	seen := map[string]bool{}
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			r.forms = append(r.forms, s)
		}
	}
	for _, escaped := range []string{
		token,
		url.QueryEscape(token),
		strings.ReplaceAll(url.QueryEscape(token), "+", "%20"),
		url.PathEscape(token),
	} {
		add(escaped)
		add(lowerHex(escaped))
	}
	for _, html := range []bool{true, false} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(html)
		enc.Encode(token)
		add(strings.TrimSuffix(strings.TrimSuffix(buf.String(), "\n"), `"`)[1:])
	}
	sort.Slice(r.forms, func(i, j int) bool { return len(r.forms[i]) > len(r.forms[j]) })
	return r
}

var percentHex = regexp.MustCompile(`%[0-9A-F]{2}`)

func lowerHex(s string) string {
	return percentHex.ReplaceAllStringFunc(s, strings.ToLower)
}

// Scrub returns s with every token= parameter's value and every form of the
// token replaced by REDACTED.
func (r *Redactor) Scrub(s string) string {
	// Checked first without the regexp or a lowered copy: this runs on
	// every runner stderr line the worker logs.
	if strings.Contains(s, "oken=") || strings.Contains(s, "OKEN=") {
		s = tokenParam.ReplaceAllString(s, "${1}"+Redacted)
	}
	if r == nil {
		return s
	}
	for _, f := range r.forms {
		if strings.Contains(s, f) {
			s = strings.ReplaceAll(s, f, Redacted)
		}
	}
	return s
}

// Has reports whether Scrub would change s.
func (r *Redactor) Has(s string) bool { return r.Scrub(s) != s }

// redactedError shows its cause scrubbed; errors.As and errors.Is still see
// the cause.
type redactedError struct {
	err error
	r   *Redactor
}

func (e *redactedError) Error() string { return e.r.Scrub(e.err.Error()) }
func (e *redactedError) Unwrap() error { return e.err }

// Error wraps err so its text is scrubbed wherever it is printed.
func (r *Redactor) Error(err error) error {
	if err == nil {
		return nil
	}
	return &redactedError{err: err, r: r}
}

// ShownURL is a URL as the worker shows it: without its query (where the
// token travels) or fragment, and with its user information redacted:
// the user name kept where a password follows it (u:REDACTED@), so a
// reader sees what is wrong with the URL, the whole of it otherwise (a
// lone user name may be a token). It works on the text, so a URL that
// does not parse is shown just as safely.
func ShownURL(raw string) string {
	s := raw
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i]
	}
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		authority, path, _ := strings.Cut(rest, "/")
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			user, hasPassword := "", false
			if i := strings.IndexByte(authority[:at], ':'); i >= 0 {
				user, hasPassword = authority[:i], true
			}
			if hasPassword && user != "" {
				authority = user + ":" + Redacted + "@" + authority[at+1:]
			} else {
				authority = Redacted + "@" + authority[at+1:]
			}
		}
		s = scheme + "://" + authority
		if strings.Contains(rest, "/") {
			s += "/" + path
		}
	}
	return s
}
