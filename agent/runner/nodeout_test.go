package runner

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// relayed runs node output written by write through a nodeOutput over
// real pipes, finished as at the answer, and returns the log events' lines.
func relayed(t *testing.T, write func(stdout, stderr io.Writer), between func(o *nodeOutput, seen func() []string)) []string {
	t.Helper()
	np, err := newNodePipes()
	if err != nil {
		t.Fatal(err)
	}
	defer np.close()
	var mu sync.Mutex
	var lines []string
	p := &Process{log: slog.New(slog.NewTextHandler(io.Discard, nil)), cfg: &Config{}}
	o := relayNodeOutput(p, np, "c1", func(frame []byte) {
		var e struct {
			CallID string `json:"call_id"`
			Event  string `json:"event"`
			Line   string `json:"line"`
		}
		if err := json.Unmarshal(frame, &e); err != nil {
			t.Errorf("frame %q: %v", frame, err)
		}
		if e.CallID != "c1" || e.Event != "log" {
			t.Errorf("frame %s", frame)
		}
		mu.Lock()
		lines = append(lines, e.Line)
		mu.Unlock()
		PutFrame(frame)
	})
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
	write(np.w[0], np.w[1])
	if between != nil {
		between(o, seen)
	}
	np.started() // the node is gone: every write end closed
	o.finish()
	return seen()
}

func TestNodeOutputFloodKeepsTheBeginningAndTheEnd(t *testing.T) {
	lines := relayed(t, func(stdout, _ io.Writer) {
		var b strings.Builder
		for i := 0; i < 5000; i++ {
			fmt.Fprintf(&b, "step %d\n", i)
		}
		b.WriteString("FINAL accuracy=0.93") // no newline: the last line still counts
		// Written in pieces no larger than the pipe takes without a reader.
		data := b.String()
		for len(data) > 0 {
			n := min(len(data), 32<<10)
			stdout.Write([]byte(data[:n]))
			data = data[n:]
		}
	}, nil)
	if lines[0] != "step 0" || lines[len(lines)-1] != "FINAL accuracy=0.93" || lines[len(lines)-100] != "step 4901" {
		t.Fatalf("got %d lines from %q to %q", len(lines), lines[0], lines[len(lines)-1])
	}
	shown, dropped := 0, 0
	for _, l := range lines {
		if strings.Contains(l, "lines dropped here") {
			var n int
			fmt.Sscanf(l, "… %d lines", &n)
			dropped += n
		} else {
			shown++
		}
	}
	if shown+dropped != 5001 || dropped == 0 {
		t.Errorf("%d lines shown and %d counted as dropped, want 5001 in all, some dropped", shown, dropped)
	}
}

func TestNodeOutputLineRules(t *testing.T) {
	lines := relayed(t, func(stdout, stderr io.Writer) {
		io.WriteString(stderr, "\r 50%|#####     |\r"+strings.Repeat(" ", 80)+"\r")
		io.WriteString(stdout, "a\r\nb\n\n \t \nbad \xff bytes\n")
		io.WriteString(stdout, strings.Repeat("x", nodeLineMax+10)+"\nafter\n")
	}, nil)
	want := []string{"a", "b", "bad \uFFFD bytes", strings.Repeat("x", nodeLineMax) + cutMark, "after", " 50%|#####     |"}
	got := map[string]bool{}
	for _, l := range lines {
		got[l] = true
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("missing line %.40q", w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("got %d lines, want %d: %.200q", len(lines), len(want), lines)
	}
}

// What the node wrote before a stream event is sent before it: sync reads
// the pipes empty, whether or not the readers got to it yet.
func TestNodeOutputSyncSendsWhatWasWritten(t *testing.T) {
	for i := 0; i < 50; i++ {
		relayed(t, func(stdout, _ io.Writer) {
			fmt.Fprintf(stdout, "before yield %d\n", i)
		}, func(o *nodeOutput, seen func() []string) {
			o.sync()
			if got := seen(); len(got) != 1 || got[0] != fmt.Sprintf("before yield %d", i) {
				t.Fatalf("after sync: %q", got)
			}
		})
	}
}
