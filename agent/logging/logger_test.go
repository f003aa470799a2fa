package logging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestRedactURL(t *testing.T) {
	// URLs are shown without their query (where the token travels) and
	// without user information.
	tests := []struct{ in, want string }{
		{"wss://e.example.com/api/v1/workers/attach?token=s3cret",
			"wss://e.example.com/api/v1/workers/attach"},
		{"wss://e.example.com/api/v1/workers/attach?pool=a&token=s3cret",
			"wss://e.example.com/api/v1/workers/attach"},
		{"wss://e.example.com/api/v1/workers/attach",
			"wss://e.example.com/api/v1/workers/attach"},
		{"wss://bob:hunter2@e.example.com/x", "wss://bob:REDACTED@e.example.com/x"},
		{"wss://bob@e.example.com/x", "wss://REDACTED@e.example.com/x"},
		{"wss://:hunter2@e.example.com/x", "wss://REDACTED@e.example.com/x"},
		{"wss://e.example.com/x?token=a%2Bb%2Fc%3D", "wss://e.example.com/x"},
		{"ws://e:8080/x?token=", "ws://e:8080/x"},
		{"ws://e:8080", "ws://e:8080"},
		{"wss://e.example.com/x#frag", "wss://e.example.com/x"},
	}
	for _, tt := range tests {
		if got := ShownURL(tt.in); got != tt.want {
			t.Errorf("ShownURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := ShownURL("wss://e/x?token=s3cret\x7f%zz"); strings.Contains(got, "s3cret") {
		t.Errorf("RedactURL of an unparseable URL = %q, shows the token", got)
	}
}

type tokenError struct{ url string }

func (e tokenError) Error() string { return "dial " + e.url + ": connection refused" }

type tokenStringer struct{}

func (tokenStringer) String() string { return "conn(tok-abc123)" }

type tokenValuer struct{}

func (tokenValuer) LogValue() slog.Value { return slog.StringValue("valuer tok-abc123") }

// Every way a token can reach a log line must come out redacted, in both
// formats.
func TestLoggerRedactsTheToken(t *testing.T) {
	const token = "tok-abc123"
	url := "wss://e/api/v1/workers/attach?token=" + token
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			log := NewLogger(&buf, format, "debug", token)
			log.Info("dialing " + url)
			log.Warn("string attr", "url", url)
			log.Error("error attr", "error", fmt.Errorf("connecting: %w", errors.New("bad token "+token)))
			log.Error("custom error", "error", tokenError{url})
			log.Info("group", slog.Group("conn", slog.String("url", url), slog.Group("inner", "token", token)))
			log.With("engine", url).Info("with")
			log.WithGroup("session").With("engine", url).Info("with group", "again", token)
			log.Info("any", "args", []string{"--token", token}, "stringer", tokenStringer{})
			log.Info("valuer", "v", tokenValuer{})
			log.Debug("debug level", "t", token)
			log.LogAttrs(context.Background(), slog.LevelInfo, "attrs", slog.Any("err", errors.New(token)))

			out := buf.String()
			if strings.Contains(out, token) {
				t.Errorf("the token appears in the log:\n%s", out)
			}
			if n := strings.Count(out, Redacted); n < 14 {
				t.Errorf("REDACTED appears %d times, want every occurrence replaced (14):\n%s", n, out)
			}
			// What is not the token is kept.
			for _, keep := range []string{"dialing wss://e/api/v1/workers/attach?token=", "connection refused", "inner", "session", "conn(", "valuer"} {
				if !strings.Contains(out, keep) {
					t.Errorf("log lost %q:\n%s", keep, out)
				}
			}
		})
	}
}

func TestLoggerWithoutTokenLogsAsIs(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, "text", "info", "")
	log.Info("hello", "k", "v")
	log.Debug("hidden")
	out := buf.String()
	if !strings.Contains(out, "msg=hello k=v") || strings.Contains(out, "hidden") {
		t.Errorf("log = %q", out)
	}
}

func TestLoggerLevel(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, "json", "warn", "tok")
	log.Info("info line")
	log.Warn("warn line")
	if out := buf.String(); strings.Contains(out, "info line") || !strings.Contains(out, `"level":"WARN"`) {
		t.Errorf("at --log-level warn: %q", out)
	}
}

// Under systemd, text lines carry the priority journald reads and no
// timestamp; elsewhere (or to another stream) they are left alone.
func TestJournalPriorities(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "journal")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	log := NewLogger(f, "text", "debug", "")
	log.Debug("d")
	log.Info("i", "k", "v")
	log.Warn("w")
	log.Error("e")
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := "<7>level=DEBUG msg=d\n<6>level=INFO msg=i k=v\n<4>level=WARN msg=w\n<3>level=ERROR msg=e\n"
	if string(b) != want {
		t.Errorf("to the journal:\n%s\nwant:\n%s", b, want)
	}

	// Another stream than the journal's: no prefix, the time kept.
	other := &bytes.Buffer{}
	NewLogger(other, "text", "info", "").Warn("w")
	if !strings.HasPrefix(other.String(), "time=") {
		t.Errorf("not to the journal: %q; want the plain text format", other.String())
	}
	// Standard error redirected to a file under a unit whose
	// JOURNAL_STREAM names the journal's stream: no prefix there either.
	redirected, err := os.CreateTemp(t.TempDir(), "redirected")
	if err != nil {
		t.Fatal(err)
	}
	defer redirected.Close()
	NewLogger(redirected, "text", "info", "").Warn("w")
	if b, _ := os.ReadFile(redirected.Name()); !bytes.HasPrefix(b, []byte("time=")) {
		t.Errorf("to a file other than the journal's stream: %q; want the plain text format", b)
	}
	if p := PriorityPrefix(redirected); p != "" {
		t.Errorf("PriorityPrefix of a file other than the journal's stream = %q; want none", p)
	}
	if p := PriorityPrefix(f); p != "<3>" {
		t.Errorf("PriorityPrefix of the journal's stream = %q; want <3>", p)
	}
	// JSON is for pipelines that parse it: never prefixed.
	g, _ := os.OpenFile(f.Name(), os.O_WRONLY|os.O_TRUNC, 0)
	defer g.Close()
	NewLogger(g, "json", "info", "").Warn("w")
	if b, _ := os.ReadFile(f.Name()); !bytes.HasPrefix(b, []byte("{")) {
		t.Errorf("JSON to the journal: %q; want it as it is", b)
	}
}

// A measured size reads at a glance: free disk is 68.8 GiB, not
// 72100812KiB.
func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{
		3:                 "3 bytes",
		72100812 << 10:    "68.8 GiB",
		200 << 20:         "200 MiB",
		1536:              "1.5 KiB",
		5 << 40:           "5 TiB",
		(1 << 30) - 1<<20: "1023 MiB",
	} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
