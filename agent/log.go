package agent

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"strings"
)

// NewLogger builds the worker's logger: text or JSON on w, at the level
// asked, with every occurrence of the token replaced. URLs are already
// logged through RedactURL; the redacting handler is the second line of
// defence for text that carries the token unexpectedly (an error that
// quotes a URL, say).
func NewLogger(w io.Writer, format, level, token string) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	if token != "" {
		h = &redactHandler{Handler: h, token: token}
	}
	return slog.New(h)
}

// Redacted replaces the token wherever it appears in logged text.
const Redacted = "REDACTED"

type redactHandler struct {
	slog.Handler
	token string
}

func (h *redactHandler) Handle(ctx context.Context, r slog.Record) error {
	clean := slog.NewRecord(r.Time, r.Level, h.scrub(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		clean.AddAttrs(h.attr(a))
		return true
	})
	return h.Handler.Handle(ctx, clean)
}

func (h *redactHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		clean[i] = h.attr(a)
	}
	return &redactHandler{Handler: h.Handler.WithAttrs(clean), token: h.token}
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{Handler: h.Handler.WithGroup(name), token: h.token}
}

func (h *redactHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.scrub(v.String()))
	case slog.KindGroup:
		group := v.Group()
		clean := make([]any, len(group))
		for i, g := range group {
			clean[i] = h.attr(g)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, h.scrub(err.Error()))
		}
		// Keep the value's shape (a list stays a list in JSON) unless its
		// text carries the token.
		if text := v.String(); strings.Contains(text, h.token) {
			return slog.String(a.Key, h.scrub(text))
		}
	}
	return a
}

func (h *redactHandler) scrub(s string) string {
	if !strings.Contains(s, h.token) {
		return s
	}
	return strings.ReplaceAll(s, h.token, Redacted)
}

// RedactURL shows a URL with its token query parameter, and any password,
// replaced, so it can be logged or shown in `status`.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Redacted)
		}
	}
	q := u.Query()
	if q.Has("token") {
		q.Set("token", Redacted)
		u.RawQuery = q.Encode()
	}
	return u.String()
}
