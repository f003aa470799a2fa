package runner

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// Invalid UTF-8 is replaced as the runtime's (Python's) decoder does:
// one U+FFFD for each maximal subpart of an ill-formed sequence.
func TestValidUTF8ReplacesMaximalSubparts(t *testing.T) {
	for in, want := range map[string]string{
		"":                     "",
		"plain ✓ text":         "plain ✓ text",
		"\xe2\x82":             "\uFFFD",             // a character cut short
		"a\xe2\x82b":           "a\uFFFDb",           // ... mid-line
		"\xff\xfe":             "\uFFFD\uFFFD",       // no character starts with them
		"\xf0\x9f\x98":         "\uFFFD",             // four bytes, the last missing
		"\xf0\x9f\x98\xc3\xa9": "\uFFFDé",            // ... and a character after
		"\xc0\xaf":             "\uFFFD\uFFFD",       // an overlong '/'
		"\xe0\x80\xaf":         "\uFFFD\uFFFD\uFFFD", // overlong: E0 is never followed by 80
		"\xed\xa0\x80":         "\uFFFD\uFFFD\uFFFD", // a surrogate
		"\xf4\x90\x80\x80":     "\uFFFD\uFFFD\uFFFD\uFFFD",
		"\xef\xbf\xbd":         "\uFFFD", // U+FFFD itself
		"\x80\xbf":             "\uFFFD\uFFFD",
	} {
		if got := string(appendValidUTF8(nil, []byte(in))); got != want {
			t.Errorf("appendValidUTF8(%q) = %q, want %q", in, got, want)
		}
	}
}

// The same, checked against Python's decoder itself for every string of
// up to three bytes from an alphabet of each kind of byte, and of four
// from a smaller one.
func TestValidUTF8MatchesPython(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 to compare with")
	}
	var inputs [][]byte
	var grow func(prefix []byte, alphabet []byte, left int)
	grow = func(prefix []byte, alphabet []byte, left int) {
		if len(prefix) > 0 {
			inputs = append(inputs, prefix)
		}
		if left == 0 {
			return
		}
		for _, b := range alphabet {
			grow(append(slices.Clip(prefix), b), alphabet, left-1)
		}
	}
	grow(nil, []byte{0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF}, 3)
	grow(nil, []byte{0x41, 0x80, 0x8F, 0x90, 0xA0, 0xBF, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xFF}, 4)
	var stdin bytes.Buffer
	for _, in := range inputs {
		stdin.WriteString(hex.EncodeToString(in) + "\n")
	}
	cmd := exec.Command(python, "-c", "import sys\nfor line in sys.stdin:\n    print(bytes.fromhex(line.strip()).decode('utf-8', 'replace').encode('utf-8').hex())")
	cmd.Stdin = &stdin
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	decoded := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(decoded) != len(inputs) {
		t.Fatalf("python3 decoded %d strings of %d", len(decoded), len(inputs))
	}
	wrong := 0
	for i, in := range inputs {
		if got := hex.EncodeToString(appendValidUTF8(nil, in)); got != decoded[i] {
			if wrong++; wrong <= 10 {
				t.Errorf("appendValidUTF8(%q) = %s; Python's decoder gives %s", in, got, decoded[i])
			}
		}
	}
	if wrong > 10 {
		t.Errorf("... %d strings in all of %d", wrong, len(inputs))
	}
}

func TestTextFrame(t *testing.T) {
	valid := []byte(`{"event":"log","line":"héllo ✓"}`)
	frame := textFrame(valid)
	if !bytes.Equal(frame, valid) {
		t.Errorf("textFrame changed valid UTF-8: %q", frame)
	}
	// The frame is sent later, from another goroutine; the reader reuses
	// its buffer for the next line. It must be a copy.
	valid[2] = 'X'
	if frame[2] == 'X' {
		t.Error("textFrame returned the caller's buffer, which the line reader overwrites")
	}

	invalid := []byte("{\"line\":\"a\xffb\xc3(\"}")
	frame = textFrame(invalid)
	if !utf8.Valid(frame) {
		t.Errorf("textFrame(%q) = %q, not valid UTF-8", invalid, frame)
	}
	if want := "{\"line\":\"a\uFFFDb\uFFFD(\"}"; string(frame) != want {
		t.Errorf("textFrame(%q) = %q, want %q", invalid, frame, want)
	}
	if !json.Valid(frame) {
		t.Errorf("textFrame made invalid JSON of a JSON line: %q", frame)
	}
}

// lineResult is one thing lineReader.Next gave: a line (copied) or a
// too-long error.
type lineResult struct {
	line    string
	tooLong bool
}

func (r lineResult) String() string {
	switch {
	case r.tooLong:
		return "[too long]"
	case len(r.line) > 40:
		return fmt.Sprintf("[%d bytes of %q…]", len(r.line), r.line[:4])
	}
	return fmt.Sprintf("[%q]", r.line)
}

// readAll drains a lineReader up to io.EOF.
func readAll(t *testing.T, lr *lineReader) []lineResult {
	t.Helper()
	var out []lineResult
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("lineReader never reached EOF")
		}
		l, err := lr.Next()
		var tooLong *lineTooLongError
		switch {
		case err == nil:
			out = append(out, lineResult{line: string(l)})
		case errors.As(err, &tooLong):
			out = append(out, lineResult{tooLong: true})
		case errors.Is(err, io.EOF):
			return out
		default:
			t.Fatalf("Next: %v", err)
		}
	}
}

func checkLines(t *testing.T, got, want []lineResult) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d results %v, want %d %v", len(got), got, len(want), want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

func ok(l string) lineResult { return lineResult{line: l} }

var tooLong = lineResult{tooLong: true}

// fill is a line of n bytes that shows where it was cut if it was.
func fill(n int, c byte) string {
	b := bytes.Repeat([]byte{c}, n)
	for i := 0; i < n; i += 1000 {
		b[i] = '0' + byte(i/1000%10)
	}
	return string(b)
}

// readers feed the same input whole, in halves and a byte at a time, so
// lines split across reads are covered.
func readers(input string) map[string]func() io.Reader {
	return map[string]func() io.Reader{
		"whole":    func() io.Reader { return strings.NewReader(input) },
		"halves":   func() io.Reader { return iotest.HalfReader(strings.NewReader(input)) },
		"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(input)) },
	}
}

func runLines(t *testing.T, input string, max int64, want []lineResult) {
	t.Helper()
	for name, r := range readers(input) {
		if name == "one byte" && len(input) > 1<<20 {
			continue
		}
		t.Run(name, func(t *testing.T) {
			checkLines(t, readAll(t, newLineReader(r(), max)), want)
		})
	}
}

func TestLineReaderBufferBoundaries(t *testing.T) {
	const k64 = lineBufferSize
	var input strings.Builder
	var want []lineResult
	for i, n := range []int{0, 1, k64 - 2, k64 - 1, k64, k64 + 1, 2*k64 - 1, 2 * k64, 2*k64 + 1, 3, 0} {
		l := fill(n, byte('a'+i))
		input.WriteString(l + "\n")
		want = append(want, ok(l))
	}
	runLines(t, input.String(), config.DefaultMaxLine, want)
}

func TestLineReaderLinesOfSeveralMiB(t *testing.T) {
	big := fill(5<<20+123, 'x')
	bigger := fill(9<<20, 'y')
	runLines(t, "before\n"+big+"\n"+bigger+"\nafter\n", config.DefaultMaxLine, []lineResult{ok("before"), ok(big), ok(bigger), ok("after")})
}

func TestLineReaderFinalLineWithoutNewline(t *testing.T) {
	big := fill(3*lineBufferSize+7, 'z')
	tests := []struct {
		input string
		want  []lineResult
	}{
		{"", nil},
		{"\n", []lineResult{ok("")}},
		{"a", []lineResult{ok("a")}},
		{"a\nb", []lineResult{ok("a"), ok("b")}},
		{"a\n\n", []lineResult{ok("a"), ok("")}},
		{`{"ok":true}`, []lineResult{ok(`{"ok":true}`)}},
		{"a\n" + big, []lineResult{ok("a"), ok(big)}},
	}
	for _, tt := range tests {
		runLines(t, tt.input, config.DefaultMaxLine, tt.want)
	}
}

// A line over the bound is skipped to its end and reported once; the
// reader then returns the lines after it, so the call can answer with a
// clear error instead of the stream being lost.
func TestLineReaderRecoversAfterATooLongLine(t *testing.T) {
	const max = 100_000
	input := "first\n" +
		fill(300_000, 'a') + "\n" + // detected while the line is still coming
		"next\n" +
		fill(max+2, 'b') + "\n" + // its end is in the same read as the overflow
		"again\n" +
		fill(lineBufferSize+1000, 'c') + "\n" +
		fill(max, 'd') + "\n" +
		fill(5<<20, 'e') + // too long, and the input ends inside it
		""
	runLines(t, input, max, []lineResult{ok("first"), tooLong, ok("next"), tooLong, ok("again"), ok(fill(lineBufferSize+1000, 'c')), ok(fill(max, 'd')), tooLong})
}

// --max-line is exact: a line of max bytes passes, one byte more does not,
// wherever the line ends and however small --max-line is (1KiB is allowed).
func TestLineReaderBoundIsExact(t *testing.T) {
	for _, max := range []int64{1024, 4096, lineBufferSize - 1, lineBufferSize, 100_000} {
		t.Run(logging.FormatBytes(max), func(t *testing.T) {
			atMax, over := fill(int(max), 'm'), fill(int(max)+1, 'o')
			t.Run("newlines", func(t *testing.T) {
				runLines(t, atMax+"\n"+over+"\n"+"next\n", max, []lineResult{ok(atMax), tooLong, ok("next")})
			})
			t.Run("over at EOF", func(t *testing.T) {
				runLines(t, "a\n"+over, max, []lineResult{ok("a"), tooLong})
			})
			t.Run("max at EOF", func(t *testing.T) {
				runLines(t, "a\n"+atMax, max, []lineResult{ok("a"), ok(atMax)})
			})
			t.Run("twice max", func(t *testing.T) {
				runLines(t, fill(2*int(max), 't')+"\nnext\n", max, []lineResult{tooLong, ok("next")})
			})
		})
	}
}

func TestLineReaderCRLF(t *testing.T) {
	lr := newLineReader(strings.NewReader("{\"event\":\"log\"}\r\nnot json\r\n{\"ok\":true}\r\n"), config.DefaultMaxLine)
	var kinds []protocol.LineKind
	var frames []string
	for {
		raw, err := lr.Next()
		if err != nil {
			break
		}
		l, kind := protocol.Classify(raw)
		kinds = append(kinds, kind)
		frames = append(frames, string(textFrame(l)))
	}
	if len(kinds) != 3 || kinds[0] != protocol.LineEvent || kinds[1] != protocol.LineGarbage || kinds[2] != protocol.LineAnswer {
		t.Errorf("kinds = %v, want event, garbage, answer", kinds)
	}
	if len(frames) == 3 && (frames[0] != `{"event":"log"}` || frames[2] != `{"ok":true}`) {
		t.Errorf("frames = %q, want them without the CR", frames)
	}
}

func TestLineTooLongErrorSaysWhatToDo(t *testing.T) {
	lr := newLineReader(strings.NewReader(fill(2<<20, 'x')+"\n"), 1<<20)
	_, err := lr.Next()
	var tooLong *lineTooLongError
	if !errors.As(err, &tooLong) {
		t.Fatalf("Next = %v, want a line-too-long error", err)
	}
	for _, want := range []string{"--max-line", "1MiB", "save_artifact"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestFramePoolAllocatesNothing(t *testing.T) {
	line := []byte(`{"call_id":"c","event":"stream","values":{"i":1}}`)
	frame.Put(textFrame(line)) // fill the pool
	allocs := testing.AllocsPerRun(1000, func() {
		frame.Put(textFrame(line))
	})
	// The race detector makes sync.Pool drop items at random.
	if allocs > 0 && !raceEnabled {
		t.Errorf("a pooled frame's round trip allocates %.1f times, want 0", allocs)
	}
}
