package agent

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runtime"
	"github.com/fluksio/fluksio-worker/platform"
)

// A call is one run or compile request and the runner process that serves
// it. Its life: start the process in its own group, write the request on
// stdin, forward each event line, heartbeat every 10 s, forward the answer,
// then stop the whole group. The call's goroutine is the one place that
// starts and stops its process.
type call struct {
	id      string
	op      string   // run or compile
	request []byte   // the request line, without its env; dropped once written
	size    int      // the request's size, for the queue's bound
	env     []string // the request's env, added to the agent's own
	agent   *Agent
	conn    *engineConn
	log     *slog.Logger
	arrived time.Time

	queued bool // waiting for a slot; guarded by Agent.mu

	// sendMu orders what the call sends: heartbeats come from the queue
	// while it waits and from supervise once it runs, and none may follow
	// the answer.
	sendMu   sync.Mutex
	answered bool
	lastBeat time.Time // the last heartbeat, or the arrival

	pid        int                    // the group's leader; set before started closes
	started    chan struct{}          // closed once the process started, or failed to
	exited     chan struct{}          // closed when the runner process is reaped
	stopReason atomic.Pointer[string] // set once the agent decides to stop it
	stopOnce   sync.Once

	// Set by the call's own goroutine, read by callEnded on it.
	begun   time.Time // when run began
	outcome string    // metrics.OutcomeOK, OutcomeError or OutcomeCancelled
	box     callBox   // cookie, escaped processes, usage (contain.go)
}

// Error answers the agent itself sends.
const (
	msgStopping = "the worker is stopping"
	msgDraining = "the worker is draining"
	// msgCancelledWaiting answers a cancel of a call that was still
	// waiting for a slot: nothing of it ever ran.
	msgCancelledWaiting = "the call was cancelled before it started"
)

// pipeLinger is how long a runner's output may stay open after the runner
// itself exited: a grandchild that inherited stdout (a forked data loader,
// say) must not keep the call from ending.
const pipeLinger = 500 * time.Millisecond

// logLinesPerSecond is a call's budget for its node's stderr and for
// runner lines that are not JSON.
const logLinesPerSecond = 1000

// stopPoll is how often a stopping group is checked for being gone.
const stopPoll = 10 * time.Millisecond

// outcome is how a runner's stdout ended.
type outcome struct {
	answer []byte // the answer line, when there was one
	err    error  // a line over --max-line; otherwise the output just ended
}

// run executes the call to its end. It returns only when the process group
// is gone and every pipe is closed.
func (c *call) run(ctx context.Context, rt Runtime) {
	c.begun = time.Now()
	c.agent.metrics.CallStarted(c.op)
	sp, warmDone := c.agent.warm.take(rt, c.env)
	defer warmDone()
	var (
		stdin            io.WriteCloser
		stdoutR, stderrR *os.File
		dir              *callDir
	)
	if sp != nil {
		stdin, stdoutR, stderrR, dir = sp.handTo(c)
		c.log.Debug("runner is a spare", "pid", c.pid)
	} else {
		var ok bool
		if stdin, stdoutR, stderrR, dir, ok = c.startCold(rt); !ok {
			return
		}
	}
	defer func() {
		if err := dir.remove(); err != nil {
			c.log.Warn("could not remove the call's directory", "dir", dir.path, "error", err)
		}
	}()
	c.agent.metrics.RunnerStarted(time.Since(c.begun))
	close(c.started)
	if c.stopReason.Load() != nil {
		// Stopped while starting: stop() left the signalling to us.
		go c.stopGroup()
	}
	request := c.request
	c.request = nil // a request of many MiB is not kept for the call's life
	go func() {
		// A runner that died before reading gets EPIPE here; its missing
		// answer is reported by the output ending, not by this write.
		stdin.Write(request)
		if len(request) >= outsizedMessage {
			request = nil
			freeMemory()
		}
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
	if c.size >= outsizedMessage || len(end.answer) >= outsizedMessage {
		freeMemory()
	}
}

// startCold starts the call's runner: a new interpreter in a new call box.
// When it cannot, the call is answered and ok is false.
func (c *call) startCold(rt Runtime) (stdin io.WriteCloser, stdoutR, stderrR *os.File, dir *callDir, ok bool) {
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
	dir, err = newCallDir(c.agent.stateDir)
	if err != nil {
		stdoutR.Close()
		stdoutW.Close()
		stderrR.Close()
		stderrW.Close()
		c.fail(err)
		return
	}
	cmd := exec.Command(c.agent.python, rt.Path)
	c.prepare(cmd, dir.env(c.agent.runnerEnv(c.env), c.agent.cfg.CancelGrace))
	cmd.Dir = dir.cwd
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	stdin, err = cmd.StdinPipe()
	if err == nil {
		platform.NewProcessGroup(cmd)
		err = c.startRunner(cmd)
	}
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdoutR.Close()
		stderrR.Close()
		if err := dir.remove(); err != nil {
			c.log.Warn("could not remove the call's directory", "dir", dir.path, "error", err)
		}
		c.fail(fmt.Errorf("starting %s: %w", c.agent.python, err))
		return
	}
	c.pid = cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		c.reaped(cmd)
		c.log.Debug("runner exited", "pid", c.pid, "status", exitStatus(err))
		close(c.exited)
	}()
	return stdin, stdoutR, stderrR, dir, true
}

// supervise waits for the call's output to end while sending heartbeats,
// and sends the answer (the runner's or the agent's own). Only this
// goroutine sends heartbeats and the answer, so nothing of the call
// follows its answer.
func (c *call) supervise(ctx context.Context, outcomes <-chan outcome, stdout *runnerOutput) outcome {
	// The first heartbeat is due protocol.HeartbeatInterval after the last one the
	// call got while it waited in the queue (or after it arrived).
	beat := time.NewTimer(time.Until(c.nextBeat()))
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
			c.beatIfDue(time.Now())
			beat.Reset(time.Until(c.nextBeat()))
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
		// The connection is gone and nobody hears an answer; the worker
		// stopped the call, so it counts as cancelled.
		c.outcome = metrics.OutcomeCancelled
		return
	}
	switch {
	case end.answer != nil:
		c.outcome = answerOutcome(end.answer)
		c.agent.metrics.AnswerRelayed(len(end.answer))
		c.sendAnswer(end.answer)
		c.log.Info("call answered")
	case end.err != nil:
		c.outcome = metrics.OutcomeError
		c.log.Error("call failed", "error", end.err)
		c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, protocol.TypeRemoteError, end.err.Error()))
	default:
		typ, msg := protocol.TypeRemoteError, protocol.MsgNodeStopped
		c.outcome = metrics.OutcomeError
		if reason := c.stopReason.Load(); reason != nil {
			typ, c.outcome = protocol.TypeNodeCancelled, metrics.OutcomeCancelled
			if *reason != "" {
				msg = *reason
			}
		} else {
			msg = c.deathMessage()
		}
		c.log.Warn("the runner's output ended without an answer", "type", typ, "message", msg)
		c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, typ, msg))
	}
}

// nextBeat is when the call's next heartbeat is due.
func (c *call) nextBeat() time.Time {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.lastBeat.Add(protocol.HeartbeatInterval)
}

// beatIfDue sends a heartbeat if none went out for protocol.HeartbeatInterval and
// the call is not answered yet.
func (c *call) beatIfDue(now time.Time) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.answered || now.Before(c.lastBeat.Add(protocol.HeartbeatInterval)) {
		return
	}
	c.lastBeat = now
	c.conn.sendJSON(protocol.NewHeartbeat(c.id))
	c.agent.metrics.HeartbeatSent()
}

// sendAnswer sends the call's answer frame; nothing of the call follows.
func (c *call) sendAnswer(frame []byte) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.answered = true
	c.conn.send(frame)
}

// wasAnswered says whether the engine was sent the call's answer.
func (c *call) wasAnswered() bool {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.answered
}

func (c *call) sendAnswerJSON(v any) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.answered = true
	c.conn.sendJSON(v)
}

// fail answers a call whose process could not be started.
func (c *call) fail(err error) {
	close(c.started)
	close(c.exited)
	c.outcome = metrics.OutcomeError
	c.log.Error("call could not start", "error", err)
	c.sendAnswerJSON(protocol.NewErrorAnswer(c.id, protocol.TypeRemoteError, err.Error()))
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
// (and the moment the runner needs to answer after it) for it to be gone,
// then sends SIGKILL.
func (c *call) stopGroup() {
	if c.pid == 0 || !c.signalAll(syscall.SIGTERM) {
		return
	}
	deadline := time.Now().Add(c.agent.cfg.CancelGrace + runnerAnswerMargin)
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
	garbage := logging.NewBudget(c.log, "the runner wrote lines that are not JSON objects; they were not forwarded", logLinesPerSecond)
	for {
		raw, err := lines.Next()
		if err != nil {
			var tooLong *lineTooLongError
			if errors.As(err, &tooLong) {
				return outcome{err: err}
			}
			garbage.Close()
			return outcome{}
		}
		line, kind := protocol.Classify(raw)
		switch kind {
		case protocol.LineEvent:
			c.agent.metrics.EventRelayed(len(line))
			c.conn.send(textFrame(line))
		case protocol.LineAnswer:
			garbage.Close()
			// Nothing reads this pipe again, so a large answer (tens of
			// MiB, at times) is sent from the reader's buffer without a
			// copy; it is too large for the frame pool to keep.
			if len(line) > maxPooledFrame && utf8.Valid(line) {
				return outcome{answer: line}
			}
			return outcome{answer: textFrame(line)}
		default:
			if len(line) > 0 {
				garbage.Log(slog.LevelWarn, "runner line is not a JSON object; not forwarded", "line", logging.Cut(line, 200))
			}
		}
	}
}

// relayStderr logs what the runner writes on stderr (the node's log),
// one log record a line, tagged with the call.
func (c *call) relayStderr(r *os.File) {
	br := bufio.NewReaderSize(r, 16<<10)
	budget := logging.NewBudget(c.log, "node stderr lines were not logged", logLinesPerSecond)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if text := bytes.TrimRight(line, "\r\n"); len(text) > 0 {
				if !budget.Log(slog.LevelInfo, logging.Cut(text, 4096), "stream", "stderr") {
					c.agent.metrics.StderrLineDropped()
				}
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			budget.Close()
			return
		}
	}
}

func exitStatus(err error) string {
	if err == nil {
		return "0"
	}
	return err.Error()
}

// Runtime is the runner script a call executes.
type Runtime = runtime.Script
