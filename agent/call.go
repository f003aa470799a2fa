package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/fluksio/fluksio-worker/platform"
)

// A call is one run or compile request and the runner process that serves
// it. Its life: start the process in its own group, write the request on
// stdin, forward each event line, heartbeat every 10 s, forward the answer,
// then stop the whole group. The call's goroutine is the one place that
// starts and stops its process.
type call struct {
	id      string
	request []byte   // the request line, without its env
	env     []string // the process environment
	agent   *Agent
	conn    *engineConn
	log     *slog.Logger

	pid        int                    // the group's leader; set before started closes
	started    chan struct{}          // closed once the process started, or failed to
	exited     chan struct{}          // closed when the runner process is reaped
	stopReason atomic.Pointer[string] // set once the agent decides to stop it
	stopOnce   sync.Once
	box        callBox // cookie, escaped processes, usage (contain.go)
}

// Error answers the agent itself sends.
const (
	errTypeCancelled = "NodeCancelled"
	errTypeRemote    = "RemoteError"
	msgNodeStopped   = "the node process stopped"
	msgStopping      = "the worker is stopping"
	msgDraining      = "the worker is draining"
)

// pipeLinger is how long a runner's output may stay open after the runner
// itself exited: a grandchild that inherited stdout (a forked data loader,
// say) must not keep the call from ending.
const pipeLinger = 500 * time.Millisecond

// stopPoll is how often a stopping group is checked for being gone.
const stopPoll = 10 * time.Millisecond

type errorAnswer struct {
	CallID string      `json:"call_id"`
	OK     bool        `json:"ok"`
	Error  errorDetail `json:"error"`
}

type errorDetail struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Short     string `json:"short"`
	Traceback string `json:"traceback"`
}

func newErrorAnswer(callID, typ, message string) errorAnswer {
	return errorAnswer{CallID: callID, Error: errorDetail{Type: typ, Message: message, Short: message}}
}

type heartbeat struct {
	CallID string `json:"call_id"`
	Event  string `json:"event"`
}

// outcome is how a runner's stdout ended.
type outcome struct {
	answer []byte // the answer line, when there was one
	err    error  // a line over --max-line; otherwise the output just ended
}

// run executes the call to its end. It returns only when the process group
// is gone and every pipe is closed.
func (c *call) run(ctx context.Context, rt Runtime) {
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		c.fail(fmt.Errorf("creating the runner's pipes: %w", err))
		return
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdoutR.Close()
		stdoutW.Close()
		c.fail(fmt.Errorf("creating the runner's pipes: %w", err))
		return
	}
	cmd := exec.Command(c.agent.python, rt.Path)
	c.prepare(cmd)
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	stdin, err := cmd.StdinPipe()
	if err == nil {
		platform.NewProcessGroup(cmd)
		err = c.startRunner(cmd)
	}
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdoutR.Close()
		stderrR.Close()
		c.fail(fmt.Errorf("starting %s: %w", c.agent.python, err))
		return
	}
	c.pid = cmd.Process.Pid
	close(c.started)
	if c.stopReason.Load() != nil {
		// Stopped while starting: stop() left the signalling to us.
		go c.stopGroup()
	}
	go func() {
		err := cmd.Wait()
		c.reaped(cmd)
		c.log.Debug("runner exited", "pid", c.pid, "status", exitStatus(err))
		close(c.exited)
	}()
	go func() {
		// A runner that died before reading gets EPIPE here; its missing
		// answer is reported by the output ending, not by this write.
		stdin.Write(c.request)
	}()
	stderrDone := make(chan struct{})
	go func() {
		c.relayStderr(stderrR)
		close(stderrDone)
	}()
	stdout := &runnerOutput{f: stdoutR}
	outcomes := make(chan outcome, 1)
	go func() { outcomes <- c.relayStdout(stdout) }()

	end := c.supervise(ctx, outcomes, stdout)
	c.agent.callEnded(c)

	// The call is over for the engine; now nothing of it may remain.
	stdin.Close()
	if end.answer != nil {
		// A runner exits by itself after its answer; give it the grace
		// period to do so before stopping whatever is left.
		select {
		case <-c.exited:
		case <-time.After(c.agent.cfg.CancelGrace):
		}
	}
	c.stopGroup()
	c.sweep()
	stdoutR.Close()
	// A process that left the group (setsid) may still hold stderr.
	stderrR.SetReadDeadline(time.Now().Add(pipeLinger))
	<-stderrDone
	stderrR.Close()
	<-c.exited
	c.logEnd()
}

// supervise waits for the call's output to end while sending heartbeats,
// and sends the answer (the runner's or the agent's own). Only this
// goroutine sends heartbeats and the answer, so nothing of the call
// follows its answer.
func (c *call) supervise(ctx context.Context, outcomes <-chan outcome, stdout *runnerOutput) outcome {
	beat := time.NewTicker(heartbeatInterval)
	defer beat.Stop()
	exited := c.exited
	var linger <-chan time.Time
	done := ctx.Done()
	for {
		select {
		case end := <-outcomes:
			c.answer(ctx, end)
			return end
		case <-beat.C:
			c.conn.sendJSON(heartbeat{CallID: c.id, Event: "heartbeat"})
		case <-exited:
			exited = nil
			linger = time.After(pipeLinger)
		case <-linger:
			// The runner is gone but its output has not ended: either
			// there is still output to read (the engine is slow to take
			// it), or something else holds the pipe. Stop the group, then
			// read on only while output keeps coming.
			linger = nil
			go func() {
				c.stopGroup()
				stdout.drain()
			}()
		case <-done:
			// The connection is gone: nobody can hear the answer, and the
			// engine reschedules the call. Stop it now.
			done = nil
			c.stop("the connection to the engine was lost")
		}
	}
}

// answer sends the call's answer: the runner's, or the agent's own when the
// output ended without one.
func (c *call) answer(ctx context.Context, end outcome) {
	if ctx.Err() != nil {
		return
	}
	switch {
	case end.answer != nil:
		c.conn.send(end.answer)
		c.log.Info("call answered")
	case end.err != nil:
		c.log.Error("call failed", "error", end.err)
		c.conn.sendJSON(newErrorAnswer(c.id, errTypeRemote, end.err.Error()))
	default:
		typ, msg := errTypeRemote, msgNodeStopped
		if reason := c.stopReason.Load(); reason != nil {
			typ = errTypeCancelled
			if *reason != "" {
				msg = *reason
			}
		} else {
			msg = c.deathMessage()
		}
		c.log.Warn("the runner's output ended without an answer", "type", typ, "message", msg)
		c.conn.sendJSON(newErrorAnswer(c.id, typ, msg))
	}
}

// fail answers a call whose process could not be started.
func (c *call) fail(err error) {
	close(c.started)
	close(c.exited)
	c.log.Error("call could not start", "error", err)
	c.conn.sendJSON(newErrorAnswer(c.id, errTypeRemote, err.Error()))
	c.agent.callEnded(c)
}

// stop asks the call's process group to end (SIGTERM, then SIGKILL after
// --cancel-grace). reason is the answer's message if the runner does not
// answer by itself; "" keeps the protocol's "the node process stopped".
func (c *call) stop(reason string) {
	c.stopOnce.Do(func() {
		c.stopReason.Store(&reason)
		select {
		case <-c.started:
			go c.stopGroup()
		default: // run signals the group once it has started
		}
	})
}

// stopGroup sends SIGTERM to the process group, waits up to --cancel-grace
// for it to be gone, then sends SIGKILL.
func (c *call) stopGroup() {
	if c.pid == 0 || !c.signalAll(syscall.SIGTERM) {
		return
	}
	deadline := time.Now().Add(c.agent.cfg.CancelGrace)
	for time.Now().Before(deadline) {
		time.Sleep(stopPoll)
		if !c.anyAlive() {
			return
		}
	}
	c.log.Warn("the runner did not stop within --cancel-grace; killing it", "grace", c.agent.cfg.CancelGrace)
	c.signalAll(syscall.SIGKILL)
}

// kill stops the process group at once, for a worker told twice to stop.
func (c *call) kill() {
	select {
	case <-c.started:
		c.signalAll(syscall.SIGKILL)
	default:
	}
}

// runnerOutput is the read end of a runner's stdout. Once draining, each
// read gives up after pipeLinger without output: a process that left the
// group (setsid) and still holds the pipe cannot keep the call open, while
// output already written is still all read.
type runnerOutput struct {
	f        *os.File
	draining atomic.Bool
}

func (o *runnerOutput) Read(p []byte) (int, error) {
	if o.draining.Load() {
		o.f.SetReadDeadline(time.Now().Add(pipeLinger))
	}
	return o.f.Read(p)
}

func (o *runnerOutput) drain() {
	o.draining.Store(true)
	o.f.SetReadDeadline(time.Now().Add(pipeLinger)) // wakes a read waiting now
}

// relayStdout forwards event lines as they come and returns the answer.
// Lines that are not JSON objects are logged here and never forwarded.
func (c *call) relayStdout(r io.Reader) outcome {
	lines := newLineReader(r, c.agent.cfg.MaxLine)
	garbage := newLogBudget(c.log, "the runner wrote lines that are not JSON objects; they were not forwarded")
	for {
		raw, err := lines.Next()
		if err != nil {
			var tooLong *lineTooLongError
			if errors.As(err, &tooLong) {
				return outcome{err: err}
			}
			garbage.close()
			return outcome{}
		}
		line, kind := classify(raw)
		switch kind {
		case lineEvent:
			c.conn.send(textFrame(line))
		case lineAnswer:
			garbage.close()
			// Nothing reads this pipe again, so a large answer (tens of
			// MiB, at times) is sent from the reader's buffer without a
			// copy; it is too large for the frame pool to keep.
			if len(line) > maxPooledFrame && utf8.Valid(line) {
				return outcome{answer: line}
			}
			return outcome{answer: textFrame(line)}
		default:
			if len(line) > 0 {
				garbage.log(slog.LevelWarn, "runner line is not a JSON object; not forwarded", "line", string(truncate(line, 200)))
			}
		}
	}
}

// relayStderr logs what the runner writes on stderr (the node's log),
// one log record a line, tagged with the call.
func (c *call) relayStderr(r *os.File) {
	br := bufio.NewReaderSize(r, 16<<10)
	budget := newLogBudget(c.log, "node stderr lines were not logged")
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if text := bytes.TrimRight(line, "\r\n"); len(text) > 0 {
				budget.log(slog.LevelInfo, string(truncate(text, 4096)), "stream", "stderr")
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			budget.close()
			return
		}
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(bytes.Clone(b[:n]), "…"...)
}

func exitStatus(err error) string {
	if err == nil {
		return "0"
	}
	return err.Error()
}

// logBudget caps how many lines a call logs per second, so a node that
// prints a million lines cannot flood the service log; what was dropped is
// counted and said once the second is over.
type logBudget struct {
	logger  *slog.Logger
	what    string
	window  time.Time
	used    int
	dropped int
}

const logLinesPerSecond = 1000

func newLogBudget(log *slog.Logger, what string) *logBudget {
	return &logBudget{logger: log, what: what}
}

func (b *logBudget) log(level slog.Level, msg string, args ...any) {
	now := time.Now()
	if now.Sub(b.window) >= time.Second {
		b.close()
		b.window, b.used = now, 0
	}
	if b.used >= logLinesPerSecond {
		b.dropped++
		return
	}
	b.used++
	b.logger.Log(context.Background(), level, msg, args...)
}

func (b *logBudget) close() {
	if b.dropped > 0 {
		b.logger.Warn(b.what, "dropped", b.dropped)
		b.dropped = 0
	}
}

// requestLine re-encodes a request without its env key, as one line.
func requestLine(fields map[string]json.RawMessage) ([]byte, error) {
	delete(fields, "env")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fields); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
