package runner

// Relaying a runner's output: its stdout lines to the engine (events) and
// the caller (the answer), its stderr lines to the log.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/agent/frame"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// logLinesPerSecond is a call's budget for its node's stderr and for
// runner lines that are not JSON.
const logLinesPerSecond = 1000

// output is the read end of a runner's stdout. Once draining, each read
// gives up after pipeLinger without output: a process that left the group
// (setsid) and still holds the pipe cannot keep the call open, while
// output already written is still all read.
type output struct {
	f        *os.File
	draining atomic.Bool
	// reads counts reads of the pipe; only the relay reads it.
	reads int
}

func (o *output) Read(p []byte) (int, error) {
	if o.draining.Load() {
		o.f.SetReadDeadline(time.Now().Add(pipeLinger))
	}
	o.reads++
	return o.f.Read(p)
}

func (o *output) drain() {
	o.draining.Store(true)
	o.f.SetReadDeadline(time.Now().Add(pipeLinger)) // wakes a read waiting now
}

// relayStdout sends event lines as they come and returns the answer.
// Lines that are not JSON objects are logged here and never sent.
// What the node wrote before an event or the answer goes out first, and
// what it wrote after an event, after it.
func (p *Process) relayStdout(send func([]byte)) Output {
	lines := newLineReader(p.stdout, p.cfg.MaxLine)
	keep := false // the answer is a slice of the reader's buffer
	defer func() {
		if !keep {
			lines.release()
		}
	}()
	garbage := logging.NewBudget(p.log, "the runner wrote lines that are not JSON objects; they were not forwarded", logLinesPerSecond)
	forwarded := -1 // p.stdout.reads at the last event forwarded
	for {
		raw, err := lines.Next()
		if err != nil {
			var tooLong *lineTooLongError
			if errors.As(err, &tooLong) {
				p.out.finish()
				return Output{Err: err}
			}
			garbage.Close()
			p.out.finish() // a runner that died: what its node wrote last
			return Output{}
		}
		line, kind := protocol.Classify(raw)
		switch kind {
		case protocol.LineEvent:
			// An event read with the last one, no read of stdout since, was
			// on the pipe when the node's pipes were read for that one: all
			// the node wrote before it was read then.
			fresh := p.stdout.reads != forwarded
			forwarded = p.stdout.reads
			p.out.forward(fresh, func() {
				p.cfg.Metrics.EventRelayed(len(line))
				send(textFrame(line))
			})
		case protocol.LineAnswer:
			garbage.Close()
			p.out.finish()
			// Nothing reads this pipe again, so a large answer (tens of
			// MiB, at times) is sent from the reader's buffer without a
			// copy; it is too large for the frame pool to keep.
			if len(line) > frame.MaxPooled && utf8.Valid(line) {
				keep = true
				return Output{Answer: line}
			}
			return Output{Answer: textFrame(line)}
		default:
			if len(line) > 0 {
				if garbage.Allow() {
					p.log.Warn("runner line is not a JSON object; not forwarded", "line", logging.Cut(line, 200))
				}
			}
		}
	}
}

// MsgNodeOutput is the message of a log record that holds a line a node
// printed (print(), logging, a library's warning), tagged with its call
// and its stream: what the node said, not the worker.
const MsgNodeOutput = "node output"

// relayStderr logs what the runner writes on stderr (the node's log),
// one log record a line, tagged with the call.
func (p *Process) relayStderr() {
	br := stderrReaders.get(p.stderr)
	defer stderrReaders.put(br)
	budget := logging.NewBudget(p.log, "node output lines were not logged", logLinesPerSecond)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if text := bytes.TrimRight(line, "\r\n"); len(text) > 0 {
				// A constant message, the node's text an attribute: a log
				// search for the worker's own messages never matches
				// what a node printed.
				if p.cfg.NodeLog.Off {
					// --node-log-level off: read, not logged.
				} else if budget.Allow() {
					p.log.Log(context.Background(), p.cfg.NodeLog.Level, MsgNodeOutput, "stream", "stderr", "line", logging.Cut(text, 4096))
				} else {
					p.cfg.Metrics.StderrLineDropped()
				}
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			budget.Close()
			return
		}
	}
}
