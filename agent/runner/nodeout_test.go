package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/frame"
)

// relayed runs node output written by write through a nodeOutput over
// real pipes, finished as at the answer, and returns the log events' lines.
func relayed(t *testing.T, write func(stdout, stderr io.Writer, mark []byte), between func(o *nodeOutput, seen func() []string)) []string {
	t.Helper()
	np, err := newNodePipes()
	if err != nil {
		t.Fatal(err)
	}
	defer np.close()
	var mu sync.Mutex
	var lines []string
	p := &Process{log: slog.New(slog.NewTextHandler(io.Discard, nil)), cfg: &Config{}}
	o := relayNodeOutput(p, np, "c1", func(msg []byte) {
		var e struct {
			CallID string `json:"call_id"`
			Event  string `json:"event"`
			Line   string `json:"line"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			t.Errorf("frame %q: %v", msg, err)
		}
		if e.CallID != "c1" || e.Event != "log" {
			t.Errorf("frame %s", msg)
		}
		mu.Lock()
		lines = append(lines, e.Line)
		mu.Unlock()
		frame.Put(msg)
	})
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
	write(np.w[0], np.w[1], o.mark)
	if between != nil {
		between(o, seen)
	}
	np.started() // the node is gone: every write end closed
	o.finish()
	return seen()
}

func TestNodeOutputFloodKeepsTheBeginningAndTheEnd(t *testing.T) {
	lines := relayed(t, func(stdout, _ io.Writer, _ []byte) {
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
	lines := relayed(t, func(stdout, stderr io.Writer, _ []byte) {
		io.WriteString(stderr, "\r 50%|#####     |\r"+strings.Repeat(" ", 80)+"\r")
		io.WriteString(stdout, "a\r\nb\n\n \t \nbad \xff bytes\ncut \xe2\x82 short\n")
		io.WriteString(stdout, strings.Repeat("x", nodeLineMax+10)+"\nafter\n")
	}, nil)
	want := []string{"a", "b", "bad \uFFFD bytes", "cut \uFFFD short", strings.Repeat("x", nodeLineMax) + cutMark, "after", " 50%|#####     |"}
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

// A stream event goes out in its place among the node's lines: after
// what was written before its mark, before what came after, whether or
// not the readers got to either yet.
func TestNodeOutputStreamEventsKeepTheirPlace(t *testing.T) {
	for i := 0; i < 50; i++ {
		var o *nodeOutput
		lines := relayed(t, func(stdout, stderr io.Writer, mark []byte) {
			// How the runtime writes: lines, the mark in both pipes (here
			// split across two writes), the event on its own stdout, then
			// the node goes on.
			io.WriteString(stdout, "before 1\nbefore ")
			io.WriteString(stderr, "err before\n")
			stdout.Write(mark[:5])
			stdout.Write(mark[5:])
			stderr.Write(mark)
			io.WriteString(stdout, "2\nafter\n")
			io.WriteString(stderr, "err after\n")
		}, func(out *nodeOutput, seen func() []string) {
			o = out
			o.forward(true, func() { o.sendLocked("stdout", "EVENT") })
		})
		at := map[string]int{}
		for n, l := range lines {
			at[l] = n + 1
		}
		if at["EVENT"] == 0 || at["before 1"] == 0 || at["err before"] == 0 || at["before 2"] == 0 || at["after"] == 0 || at["err after"] == 0 {
			t.Fatalf("lines %q", lines)
		}
		if !(at["before 1"] < at["EVENT"] && at["err before"] < at["EVENT"] && at["EVENT"] < at["after"] && at["EVENT"] < at["err after"] && at["EVENT"] < at["before 2"]) {
			t.Fatalf("attempt %d: the event is out of place: %q", i, lines)
		}
	}
}

// A line the node wrote on one pipe before flooding the other is sent,
// whichever reader's turn finds the two: the smaller read's lines go
// first. (The flood is over the burst in one read.)
// unreadNodeOutput is a relay of new node pipes whose readers are not
// started (the test reads), and the lines it sent so far.
func unreadNodeOutput(t *testing.T) (*nodeOutput, *nodePipes, *[]string) {
	np, err := newNodePipes()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(np.close)
	var lines []string
	p := &Process{log: slog.New(slog.NewTextHandler(io.Discard, nil)), cfg: &Config{}}
	o := newNodeOutput(p, np, "c1", func(msg []byte) {
		var e struct{ Line string }
		json.Unmarshal(msg, &e)
		lines = append(lines, e.Line)
		frame.Put(msg)
	})
	return o, np, &lines
}

func TestNodeOutputALineBeforeAFloodOnTheOtherPipeIsKept(t *testing.T) {
	for _, turn := range []int{0, 1} {
		for _, line := range []int{0, 1} {
			t.Run(fmt.Sprintf("line on %d, turn of %d", line+1, turn+1), func(t *testing.T) {
				o, np, sent := unreadNodeOutput(t)
				io.WriteString(np.w[line], "before the flood\n")
				var flood strings.Builder
				for i := 0; flood.Len() < 60<<10; i++ {
					fmt.Fprintf(&flood, "flood %d\n", i)
				}
				io.WriteString(np.w[1-line], flood.String())

				o.mu.Lock()
				n, err := o.turnLocked(o.streams[turn])
				o.mu.Unlock()
				if n <= 0 || err != nil {
					t.Fatalf("read %d bytes (%v)", n, err)
				}
				if lines := *sent; len(lines) < logBurst || lines[0] != "before the flood" {
					t.Fatalf("sent %d lines, the first %q: want the burst at least, the line first", len(lines), lines[0])
				}
			})
		}
	}
}

// heldBytes is what o holds of the node's output that it has not sent:
// lines waiting for their stream event or over the budget, and the
// pieces of lines and marks being assembled.
func heldBytes(o *nodeOutput) (lines, bytes int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range append(slices.Clip(o.later), o.held...) {
		lines++
		bytes += len(h.line)
	}
	for _, s := range o.streams {
		bytes += len(s.pending) + len(s.carry)
	}
	return lines, bytes
}

// A node that writes the runner's mark itself (it found the token) and
// then floods makes every later line wait for a stream event one further
// on: the worker holds no more of them than the budget lets through, and
// what is sent is in the order it was written, with a note where lines
// went.
func TestNodeOutputForgedMarkHoldsNoMoreThanTheBudget(t *testing.T) {
	const lineSize = 1 << 10
	const count = 20000 // 20 MiB of lines, some 20 times what the bound holds
	var out io.Writer
	maxLines, maxBytes := 0, 0
	lines := relayed(t, func(stdout, _ io.Writer, mark []byte) {
		stdout.Write(mark) // forged: no stream event follows it
		out = stdout
	}, func(o *nodeOutput, _ func() []string) {
		pad := strings.Repeat("x", lineSize-len("line 00000 \n"))
		var chunk strings.Builder
		for i := 0; i < count; i++ {
			fmt.Fprintf(&chunk, "line %05d %s\n", i, pad)
			if chunk.Len() >= 32<<10 || i == count-1 {
				// A write returns once the reader took most of it in.
				io.WriteString(out, chunk.String())
				chunk.Reset()
				n, b := heldBytes(o)
				maxLines, maxBytes = max(maxLines, n), max(maxBytes, b)
			}
		}
	})
	if limit := maxLater + logTail; maxLines > limit {
		t.Errorf("the worker held %d lines at once; the budget holds %d", maxLines, limit)
	}
	if limit := (maxLater + logTail + 2) * lineSize; maxBytes > limit {
		t.Errorf("the worker held %d bytes at once; the budget holds %d", maxBytes, limit)
	}
	last, notes := -1, 0
	for _, l := range lines {
		if strings.Contains(l, "lines dropped here") {
			notes++
			continue
		}
		var n int
		if _, err := fmt.Sscanf(l, "line %d ", &n); err != nil {
			t.Fatalf("unexpected line %q", l)
		}
		if n <= last {
			t.Fatalf("line %d sent after line %d", n, last)
		}
		last = n
	}
	if last != count-1 || notes == 0 || len(lines) < logBurst+logTail {
		t.Errorf("%d lines sent, the last %d, %d notes: want the burst, a note, the tail up to line %d", len(lines), last, notes, count-1)
	}
}

// Events read from the runner's stdout at once read the node's pipes once
// for them all, not once an event: what the node wrote before any of them
// was in its pipes when they were read. Two reads an event were most of
// the worker's CPU relaying a chatty call. (Their order among the node's
// lines: TestNodeOutputStreamEventsKeepTheirPlace.)
func TestNodeOutputEventsReadTogetherReadThePipesOnce(t *testing.T) {
	if _, err := readSyscalls(); err != nil {
		t.Skipf("no count of read system calls: %v", err)
	}
	np, err := newNodePipes()
	if err != nil {
		t.Fatal(err)
	}
	defer np.close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := &Process{log: slog.New(slog.NewTextHandler(io.Discard, nil)), cfg: &Config{MaxLine: 1 << 20}, stdout: &output{f: r}}
	var lines []string
	p.out = relayNodeOutput(p, np, "c1", func(msg []byte) {
		lines = append(lines, string(msg)) // under the relay's mutex
		frame.Put(msg)
	})
	io.WriteString(np.w[1], "before the events\n")
	const events = 2000
	var stdout bytes.Buffer
	for i := range events {
		fmt.Fprintf(&stdout, `{"call_id":"c1","event":"stream","values":{"i":%d}}`+"\n", i)
	}
	stdout.WriteString(`{"call_id":"c1","ok":true}` + "\n")
	go func() {
		w.Write(stdout.Bytes())
		w.Close()
	}()

	before, _ := readSyscalls()
	sent := 0
	end := p.relayStdout(func(msg []byte) {
		sent++
		frame.Put(msg)
	})
	after, _ := readSyscalls()
	np.started()
	if end.Answer == nil || sent != events {
		t.Fatalf("relayed %d of %d events, answer %q", sent, events, end.Answer)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "before the events") {
		t.Errorf("node lines %q", lines)
	}
	// Reads of stdout (a few dozen at most: 110 KB) and of the node's
	// pipes for each of them; not one of the node's pipes an event.
	if reads := after - before; reads >= events/2 {
		t.Errorf("%d read system calls relaying %d events: the node's pipes are read for each event", reads, events)
	}
}

// readSyscalls is how many read system calls this process has made.
func readSyscalls() (int, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("no syscr in /proc/self/io")
}

// A stream event sends every line that waited for it, whichever pipe it
// came on: a line of the other pipe read before it and waiting for a later
// event does not hold it back (it held the node's stdout behind its stderr
// up to the call's last event).
func TestNodeOutputAnEventSendsAllItsLinesPastOnesWaitingLonger(t *testing.T) {
	o, np, sent := unreadNodeOutput(t)
	// The node ran two events ahead on stderr, and that was read first.
	np.w[1].Write(append(append(slices.Clone(o.mark), o.mark...), "err after 2\n"...))
	o.mu.Lock()
	o.drainLocked()
	o.mu.Unlock()
	np.w[0].Write(append(slices.Clone(o.mark), "out after 1\n"...))

	o.forward(true, func() { o.sendLocked("stdout", "EVENT 1") })
	if want := []string{"EVENT 1", "out after 1"}; !slices.Equal(*sent, want) {
		t.Fatalf("after the first event: %q, want %q", *sent, want)
	}
	o.forward(true, func() { o.sendLocked("stdout", "EVENT 2") })
	if want := []string{"EVENT 1", "out after 1", "EVENT 2", "err after 2"}; !slices.Equal(*sent, want) {
		t.Errorf("after the second event: %q, want %q", *sent, want)
	}
}
