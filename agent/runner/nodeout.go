package runner

// The node's output: what node code writes on its stdout and stderr (from
// Python, C or the processes it starts), turned into the call's log
// events by the worker itself.
//
// The worker makes the two pipes the node's fd 1 and fd 2 become and is
// their only reader. A reader inside the runner (a thread of the dying
// process) loses what the node wrote just before a hard exit: a line
// printed before os._exit, a segfault's faulthandler stack, the last words
// before the OOM killer. Here nothing written is lost with the runner.
//
// Order: before each stream event the runtime pushes what the node
// buffered into the pipes and writes a mark into each (a token of this
// runner's, which node code never sees). Lines before the mark go out
// before the event, lines after it are held until the stdout relay has
// forwarded the event: a line printed before a yield arrives before that
// yield's values, one printed after, after them. Before the answer the
// pipes are read empty.
//
// The rules for lines are the embedded runtime's (its LogPump serves a
// runtime started without the worker, its unit tests): a line ends at \n,
// \r\n or \r (progress bars), blank pieces are dropped, a line over
// nodeLineMax is cut, and log events are budgeted: a burst of logBurst,
// then logRate a second; under a flood the middle goes, the newest
// logTail lines over the budget are held and all sent before the answer,
// and a note stands where lines went missing.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/logging"
)

// lineEnd ends a line: progress bars redraw with \r.
var lineEnd = regexp.MustCompile("\r\n|\n|\r")

var cutMark = fmt.Sprintf(" … [line cut at %d bytes]", nodeLineMax)

// nodePipes is a runner's pipes for its node's stdout and stderr, from
// its start (a spare's is made ahead) until its call relays them.
type nodePipes struct {
	r, w  [2]*os.File // stdout, stderr
	token string
	// tokenR is the read end of the pipe the token is passed on (pass),
	// until the runner started.
	tokenR *os.File
}

func newNodePipes() (*nodePipes, error) {
	var t [markTokenSize / 2]byte
	rand.Read(t[:])
	np := &nodePipes{token: hex.EncodeToString(t[:])}
	for i := range np.r {
		r, w, err := runnerPipe(0)
		if err != nil {
			np.close()
			return nil, fmt.Errorf("creating the node's output pipes: %w", err)
		}
		np.r[i], np.w[i] = r, w
	}
	return np, nil
}

// pass adds the write ends and the token's pipe to cmd's extra files,
// and the flag that names them to its arguments (right after the
// runtime's path). The token is written into its pipe now, whole (a pipe
// holds far more), and the write end closed: the runtime reads it to its
// end, so the token is never in the runner's argv or environment.
func (np *nodePipes) pass(args []string, extra []*os.File) ([]string, []*os.File, error) {
	r, w, err := runnerPipe(-1)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the node's output pipes: %w", err)
	}
	_, err = io.WriteString(w, np.token)
	w.Close()
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("passing the node's output mark: %w", err)
	}
	np.tokenR = r
	// The node's stdout and stderr pipes next, and the token's
	// outputTokenAfter past the first.
	first := firstExtraFD + len(extra)
	args = append([]string{args[0], outputFlag, strconv.Itoa(first)}, args[1:]...)
	passed := make([]*os.File, outputTokenAfter+1)
	passed[0], passed[1], passed[outputTokenAfter] = np.w[0], np.w[1], r
	return args, append(extra, passed...), nil
}

// passedNodePipes makes a runner's node pipes and passes them (pass).
func passedNodePipes(args []string, extra []*os.File) (*nodePipes, []string, []*os.File, error) {
	np, err := newNodePipes()
	if err != nil {
		return nil, nil, nil, err
	}
	if args, extra, err = np.pass(args, extra); err != nil {
		np.close()
		return nil, nil, nil, err
	}
	return np, args, extra, nil
}

// started closes the worker's copies of the write ends, and of the
// token's pipe: only the node's processes write there.
func (np *nodePipes) started() {
	if np == nil {
		return
	}
	if np.tokenR != nil {
		np.tokenR.Close()
		np.tokenR = nil
	}
	for i, w := range np.w {
		if w != nil {
			w.Close()
			np.w[i] = nil
		}
	}
}

func (np *nodePipes) close() {
	if np == nil {
		return
	}
	np.started()
	for i, r := range np.r {
		if r != nil {
			r.Close()
			np.r[i] = nil
		}
	}
}

// nodeStream is one of the two pipes as it is read.
type nodeStream struct {
	name    string
	f       *os.File
	fd      int
	pending []byte // the line being assembled
	cutting bool   // skipping the rest of a line sent cut
	carry   []byte // what may be the start of a mark
	marks   int    // marks read: stream events this stream is past
}

type heldLine struct {
	stream string
	line   []byte
	after  int // the stream events it follows
	// skipped is how many lines went just before this one while they
	// waited for their stream event (maxLater).
	skipped int
}

// maxLater bounds the lines held for a stream event not forwarded yet as
// the budget bounds all lines: the burst and the tail are kept, the middle
// goes, with a note in its place. A node writes a mark only by accident
// or by finding the runner's token (worker_main.py keeps it out of its
// reach, but in its own process): a forged mark makes every later line
// wait for an event one further on, and must not make the worker hold
// them all.
const maxLater = logBurst + logTail

// nodeOutput relays a runner's node output. Its mutex serialises reading
// the pipes and everything after: the two readers, sync and finish.
type nodeOutput struct {
	p      *Process
	callID string
	send   func([]byte)

	mu       sync.Mutex
	streams  []*nodeStream
	tokens   float64
	refilled time.Time
	mark     []byte
	events   int        // stream events forwarded
	later    []heldLine // lines past a mark whose event is not forwarded yet
	held     []heldLine // over the budget, oldest first; at most logTail
	dropped  int        // lines dropped since the last one sent
	journal  *logging.Budget
	done     bool // finished: nothing more is read or sent
	// behind: the last drain stopped at its bound, with more to read.
	behind bool
	// buf is what every read of both pipes goes into: they all hold mu,
	// and what is read is copied out before mu is let go. Taken from
	// nodeReadBuffers at the first read, given back once done.
	buf *[nodeReadSize]byte
}

// relayNodeOutput starts reading np for p's call.
func relayNodeOutput(p *Process, np *nodePipes, callID string, send func([]byte)) *nodeOutput {
	o := newNodeOutput(p, np, callID, send)
	for _, s := range o.streams {
		go o.read(s)
	}
	return o
}

func newNodeOutput(p *Process, np *nodePipes, callID string, send func([]byte)) *nodeOutput {
	o := &nodeOutput{p: p, callID: callID, send: send, tokens: logBurst, refilled: time.Now(),
		mark:    []byte(markPrefix + np.token + markSuffix),
		journal: logging.NewBudget(p.log, "node output lines were not logged", logLinesPerSecond)}
	for i, name := range []string{"stdout", "stderr"} {
		s := &nodeStream{name: name, f: np.r[i], fd: -1}
		if rc, err := s.f.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { s.fd = int(fd) })
		}
		o.streams = append(o.streams, s)
	}
	return o
}

// read relays one pipe as output comes, until it ends or the call does.
func (o *nodeOutput) read(s *nodeStream) {
	rc, err := s.f.SyscallConn()
	if err != nil {
		return
	}
	for {
		var n int
		var rerr error
		err := rc.Read(func(uintptr) bool {
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.done {
				n = 0
				return true
			}
			n, rerr = o.turnLocked(s)
			return !errors.Is(rerr, syscall.EAGAIN)
		})
		if err != nil || n <= 0 && !errors.Is(rerr, syscall.EINTR) {
			return
		}
	}
}

// readLocked reads once from s and takes the lines it finishes.
func (o *nodeOutput) readLocked(s *nodeStream) (int, error) {
	n, err := o.readIntoLocked(s, o.buffer())
	if n > 0 {
		o.feedLocked(s, o.buf[:n])
	}
	return n, err
}

// buffer is what reads of both pipes go into (they all hold mu).
func (o *nodeOutput) buffer() []byte {
	if o.buf == nil {
		o.buf = nodeReadBuffers.Get().(*[nodeReadSize]byte)
	}
	return o.buf[:]
}

func (o *nodeOutput) readIntoLocked(s *nodeStream, buf []byte) (int, error) {
	if s.fd < 0 {
		return 0, nil
	}
	return syscall.Read(s.fd, buf)
}

// turnLocked is one turn of s's reader: it reads from s, then once from
// the other pipe, and takes the smaller read's lines first. Which pipe's
// bytes were written first is not known once both hold some, but a line
// written on one pipe just before a flood on the other is the common case
// (a warning, then a progress flood), and the flood must not spend the
// budget ahead of it: the line would be dropped with the flood's middle,
// whichever reader's turn found the two. The other pipe is read after s,
// not before, so that a pause between the two reads (the worker
// descheduled on a loaded machine) cannot let the line and the flood both
// be written in between.
func (o *nodeOutput) turnLocked(s *nodeStream) (int, error) {
	buf := o.buffer()
	own, other := buf[:len(buf)/2], buf[len(buf)/2:]
	n, err := o.readIntoLocked(s, own)
	var peer *nodeStream
	m := 0
	for _, q := range o.streams {
		if q != s {
			peer = q
			m, _ = o.readIntoLocked(q, other)
		}
	}
	if m > 0 && (n <= 0 || m < n) {
		o.feedLocked(peer, other[:m])
		m = 0
	}
	if n > 0 {
		o.feedLocked(s, own[:n])
	}
	if m > 0 {
		o.feedLocked(peer, other[:m])
	}
	return n, err
}

// drainLocked reads what both pipes hold now, without waiting for more.
// Bounded, so a process writing flat out cannot hold the relay (behind
// says it stopped there).
func (o *nodeOutput) drainLocked() {
	o.behind = false
	for _, s := range o.streams {
		read := 0
		for read < 4<<20 {
			n, err := o.readLocked(s)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if n <= 0 {
				break
			}
			read += n
		}
		o.behind = o.behind || read >= 4<<20
	}
}

// forward sends a stream event with send, in its place among the node's
// lines: after what the node wrote before it, before what came after.
// Lines held over the budget are dropped (they cannot follow the event).
// fresh says the event's line was read from the runner's stdout after the
// pipes were last drained; one read before that (in the same read as the
// last event) finds what the node wrote before it already read, and the
// pipes are not read again for it: two reads an event were most of the
// relay's CPU in a flood of events.
func (o *nodeOutput) forward(fresh bool, send func()) {
	if o == nil {
		send()
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done {
		o.settleLocked(false, fresh || o.behind)
	}
	send()
	o.events++
	// Every line this event was waiting for goes, whichever pipe it came
	// on: a line of the other pipe that waits for a later event, read
	// before it, does not hold it back.
	later := o.later
	o.later = nil
	for _, h := range later {
		if h.after > o.events {
			o.later = append(o.later, h)
			continue
		}
		o.dropped += h.skipped
		o.budgetLocked(h.stream, h.line)
	}
}

// finish sends everything the node wrote, the held tail and an unfinished
// last line included, before the call's answer; nothing is sent after.
func (o *nodeOutput) finish() {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done {
		o.settleLocked(true, true)
	}
}

func (o *nodeOutput) settleLocked(final, drain bool) {
	if drain {
		o.drainLocked()
	}
	if !final {
		o.dropped += len(o.held)
		o.held = nil
		o.noteDroppedLocked()
		return
	}
	for _, s := range o.streams {
		o.linesLocked(s, s.carry)
		if !s.cutting {
			o.takeLocked(s, s.pending)
		}
		s.carry, s.pending, s.cutting = nil, nil, false
	}
	for _, h := range o.later {
		o.dropped += h.skipped
		o.budgetLocked(h.stream, h.line)
	}
	o.later = nil
	o.noteDroppedLocked()
	for _, h := range o.held {
		o.emitLocked(h.stream, h.line)
	}
	o.held = nil
	o.doneLocked()
	o.journal.Close()
}

// doneLocked ends the reading: nothing reads into buf after it.
func (o *nodeOutput) doneLocked() {
	o.done = true
	if o.buf != nil {
		nodeReadBuffers.Put(o.buf)
		o.buf = nil
	}
}

// stop ends the relay without sending more, before the pipes are closed.
func (o *nodeOutput) stop() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.doneLocked()
	o.mu.Unlock()
}

// feedLocked takes what was read: marks out, lines in.
func (o *nodeOutput) feedLocked(s *nodeStream, data []byte) {
	if len(s.carry) > 0 {
		data = append(s.carry, data...)
		s.carry = nil
	}
	for {
		i := bytes.Index(data, o.mark)
		if i < 0 {
			break
		}
		o.linesLocked(s, data[:i])
		s.marks++
		data = data[i+len(o.mark):]
	}
	keep := 0 // a mark may have begun at the end of this read
	for k := min(len(o.mark)-1, len(data)); k > 0; k-- {
		if bytes.HasPrefix(o.mark, data[len(data)-k:]) {
			keep = k
			break
		}
	}
	o.linesLocked(s, data[:len(data)-keep])
	s.carry = append([]byte(nil), data[len(data)-keep:]...)
}

// linesLocked splits data into lines, finishing the one being assembled.
func (o *nodeOutput) linesLocked(s *nodeStream, data []byte) {
	for {
		loc := lineEnd.FindIndex(data)
		if loc == nil {
			break
		}
		if s.cutting {
			s.cutting = false // the end of a line already sent cut
		} else {
			o.takeLocked(s, append(s.pending, data[:loc[0]]...))
		}
		s.pending = s.pending[:0]
		data = data[loc[1]:]
	}
	if s.cutting {
		return
	}
	s.pending = append(s.pending, data...)
	if len(s.pending) > nodeLineMax {
		o.takeLocked(s, s.pending)
		s.pending, s.cutting = nil, true
	}
}

// takeLocked logs one line and sends it within the budget, or holds it
// while the stream event it follows is not forwarded yet.
func (o *nodeOutput) takeLocked(s *nodeStream, line []byte) {
	if len(bytes.TrimSpace(line)) == 0 {
		return // empty, or what a progress bar clears itself with ("\r" + spaces)
	}
	if len(line) > nodeLineMax {
		line = append(line[:nodeLineMax:nodeLineMax], cutMark...)
	} else {
		line = bytes.Clone(line)
	}
	// Logged as the runner's stderr lines are (what the node printed went
	// there before the worker read it): a constant message, the node's
	// text an attribute, so a log search for the worker's own messages
	// never matches what a node printed.
	if o.p.cfg.NodeLog.Off {
		// --node-log-level off: read, not logged.
	} else if o.journal.Allow() {
		o.p.log.Log(context.Background(), o.p.cfg.NodeLog.Level, MsgNodeOutput, "stream", s.name, "line", logging.Cut(line, 4096))
	} else {
		o.p.cfg.Metrics.StderrLineDropped()
	}
	if s.marks > o.events {
		o.later = append(o.later, heldLine{stream: s.name, line: line, after: s.marks})
		if len(o.later) > maxLater {
			// The oldest line past the burst goes; the next one notes it.
			o.later[logBurst+1].skipped += 1 + o.later[logBurst].skipped
			o.later = slices.Delete(o.later, logBurst, logBurst+1)
		}
		return
	}
	o.budgetLocked(s.name, line)
}

// budgetLocked sends a line within the budget, holding the newest over it.
func (o *nodeOutput) budgetLocked(stream string, line []byte) {
	now := time.Now()
	o.tokens = min(logBurst, o.tokens+now.Sub(o.refilled).Seconds()*logRate)
	o.refilled = now
	o.held = append(o.held, heldLine{stream: stream, line: line})
	if len(o.held) > logTail {
		o.held = o.held[1:]
		o.dropped++
	}
	for len(o.held) > 0 && o.tokens >= 1 {
		o.tokens--
		o.emitLocked(o.held[0].stream, o.held[0].line)
		o.held = o.held[1:]
	}
}

func (o *nodeOutput) emitLocked(stream string, line []byte) {
	o.noteDroppedLocked()
	if !utf8.Valid(line) {
		line = appendValidUTF8(nil, line) // as the runtime's decoder does, not encoding/json's byte by byte
	}
	o.sendLocked(stream, string(line))
}

func (o *nodeOutput) noteDroppedLocked() {
	if o.dropped == 0 {
		return
	}
	note := fmt.Sprintf("… %d lines dropped here (a call's log events are limited to %d lines, then %d a second; the worker's log has more)", o.dropped, logBurst, logRate)
	o.dropped = 0
	o.sendLocked("stderr", note)
}

// sendLocked sends one log event as the runtime writes them.
func (o *nodeOutput) sendLocked(stream, line string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Invalid UTF-8 becomes U+FFFD: a text frame must be UTF-8.
	if err := enc.Encode(struct {
		CallID string `json:"call_id"`
		Event  string `json:"event"`
		Stream string `json:"stream"`
		Line   string `json:"line"`
	}{o.callID, "log", stream, line}); err != nil {
		return
	}
	o.p.cfg.Metrics.EventRelayed(buf.Len() - 1)
	o.send(append(frame.Get(buf.Len()-1), bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...))
}
