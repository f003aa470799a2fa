package logging

import (
	"context"
	"io"
	"log/slog"
	"os"
)

// NewLogger builds the worker's logger: text or JSON on w, at the level
// asked, with every occurrence of the token replaced. URLs are already
// logged through RedactURL; the redacting handler is the second line of
// defence for text that carries the token unexpectedly (an error that
// quotes a URL, say). Text written to systemd's journal (ToJournal) starts
// with its priority, <3> to <7>, and leaves out the time the journal
// records itself.
func NewLogger(w io.Writer, format, level, token string) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch {
	case format == "json":
		h = slog.NewJSONHandler(w, opts)
	case ToJournal(w, os.Getenv):
		opts.ReplaceAttr = withoutTime
		h = slog.NewTextHandler(journalWriter{w}, opts)
	default:
		h = slog.NewTextHandler(w, opts)
	}
	// Even without a token to look for, token= parameters are replaced.
	h = &redactHandler{Handler: h, r: NewRedactor(token)}
	return slog.New(h)
}

type redactHandler struct {
	slog.Handler
	r *Redactor
}

func (h *redactHandler) Handle(ctx context.Context, r slog.Record) error {
	clean := slog.NewRecord(r.Time, r.Level, h.r.Scrub(r.Message), r.PC)
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
	return &redactHandler{Handler: h.Handler.WithAttrs(clean), r: h.r}
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{Handler: h.Handler.WithGroup(name), r: h.r}
}

func (h *redactHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.r.Scrub(v.String()))
	case slog.KindGroup:
		group := v.Group()
		clean := make([]any, len(group))
		for i, g := range group {
			clean[i] = h.attr(g)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, h.r.Scrub(err.Error()))
		}
		// Keep the value's shape (a list stays a list in JSON) unless its
		// text carries the token.
		if text := v.String(); h.r.Has(text) {
			return slog.String(a.Key, h.r.Scrub(text))
		}
	}
	return a
}
