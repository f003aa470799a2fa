package logging

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
)

// journalLevels maps the level the text format writes first on a line (the
// timestamp left out) to the sd-daemon(3) priority prefix journald reads,
// so that `journalctl -p warning` shows warnings and errors only.
var journalLevels = []struct {
	text   string
	prefix string
}{
	{"level=ERROR", "<3>"},
	{"level=WARN", "<4>"},
	{"level=INFO", "<6>"},
	{"level=DEBUG", "<7>"},
}

// ToJournal reports whether w is the stream systemd connected to the
// journal: JOURNAL_STREAM names its device and inode (systemd.exec(5)).
// A worker whose stderr was redirected elsewhere (a file, a pipe to
// another program) does not prefix priorities that nobody would strip.
func ToJournal(w io.Writer, getenv func(string) string) bool {
	f, ok := w.(*os.File)
	stream := getenv("JOURNAL_STREAM")
	if !ok || stream == "" {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return stream == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// journalWriter prefixes each record, written whole by one Write, with
// its priority.
type journalWriter struct{ w io.Writer }

func (j journalWriter) Write(p []byte) (int, error) {
	for _, l := range journalLevels {
		if bytes.HasPrefix(p, []byte(l.text)) {
			if _, err := j.w.Write(append([]byte(l.prefix), p...)); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return j.w.Write(p)
}

// withoutTime drops the record's timestamp: journald records its own.
func withoutTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// PriorityPrefix is the prefix for a line written without the logger (an
// error before the logger exists) at error priority, where w goes to the
// journal; "" elsewhere.
func PriorityPrefix(w io.Writer) string {
	if ToJournal(w, os.Getenv) {
		return "<3>"
	}
	return ""
}
