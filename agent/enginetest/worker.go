package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// Hello is a worker's first message as the engine got it: the protocol's
// hello, and its bytes as they came.
type Hello struct {
	protocol.Hello
	Raw []byte `json:"-"`
}

// Message is one frame from a worker, with the fields tests look at most.
type Message struct {
	Raw    []byte
	CallID string
	Event  string
	OK     bool
	Error  *protocol.ErrorDetail
}

// IsAnswer reports whether the message ends its call.
func (m Message) IsAnswer() bool { return m.Event == "" }

// Decode unmarshals the whole message into v.
func (m Message) Decode(v any) error { return json.Unmarshal(m.Raw, v) }

func parse(raw []byte) (Message, error) {
	var head struct {
		CallID json.RawMessage       `json:"call_id"`
		Event  json.RawMessage       `json:"event"`
		OK     bool                  `json:"ok"`
		Error  *protocol.ErrorDetail `json:"error"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return Message{}, err
	}
	m := Message{Raw: raw, OK: head.OK, Error: head.Error}
	if json.Unmarshal(head.CallID, &m.CallID) != nil {
		m.CallID = string(head.CallID)
	}
	switch ev := string(head.Event); {
	case ev == "" || ev == "null" || ev == "false" || ev == `""` || ev == "0":
	case ev[0] == '"':
		json.Unmarshal(head.Event, &m.Event)
	default:
		m.Event = ev
	}
	return m, nil
}

// Worker is one attached worker connection.
type Worker struct {
	Hello Hello

	ws      *websocket.Conn
	frozen  atomic.Bool
	paused  atomic.Int64 // UnixNano until which nothing is read
	writeMu sync.Mutex
	done    chan struct{}
	once    sync.Once

	mu    sync.Mutex
	calls map[string]*Call
	other chan Message // frames for no known call, and frames that are not JSON
	tally *Tally       // when set, takes the frames of calls nobody registered

	control *control // pings and the close frame received; see record.go

	// engine is set when the welcome accepted the resume extension: the
	// engine answers the worker's resume message (resume.go).
	engine *Engine
	resume chan protocol.ResumeHello
}

func newWorker(ws *websocket.Conn, hello Hello, resumer *Engine) *Worker {
	w := &Worker{
		engine: resumer,
		Hello:  hello,
		ws:     ws,
		done:   make(chan struct{}),
		calls:  map[string]*Call{},
		other:  make(chan Message, 1024),
		resume: make(chan protocol.ResumeHello, 1),
	}
	ws.SetPingHandler(func(data string) error {
		if w.frozen.Load() {
			return nil
		}
		w.writeMu.Lock()
		defer w.writeMu.Unlock()
		return ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(10*time.Second))
	})
	w.watchControl()
	go w.readLoop()
	return w
}

func (w *Worker) readLoop() {
	defer w.Drop()
	for {
		if until := time.Unix(0, w.paused.Load()); time.Now().Before(until) {
			time.Sleep(time.Until(until))
		}
		_, raw, err := w.ws.ReadMessage()
		if err != nil {
			return
		}
		m, err := parse(raw)
		if err != nil {
			m = Message{Raw: raw}
		}
		if m.CallID == "" && w.engine != nil && w.engine.resumeMessage(w, raw) {
			continue
		}
		w.mu.Lock()
		c, tally := w.calls[m.CallID], w.tally
		w.mu.Unlock()
		if c == nil && tally != nil && m.CallID != "" {
			tally.add(m)
			continue
		}
		if c == nil {
			select {
			case w.other <- m:
			default: // nobody is reading strays; drop the oldest
				<-w.other
				w.other <- m
			}
			continue
		}
		c.deliver(m)
		if m.IsAnswer() {
			w.acknowledge(m.CallID)
		}
	}
}

// Freeze makes this end of the connection stop answering pings while
// keeping the socket open: what a peer behind a dead NAT looks like.
func (w *Worker) Freeze() { w.frozen.Store(true) }

// PauseReads stops reading from the worker for d, from its next message:
// an engine too busy to keep up, so the worker's sends back up.
func (w *Worker) PauseReads(d time.Duration) { w.paused.Store(time.Now().Add(d).UnixNano()) }

// Done is closed when the connection has ended.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Drop closes the connection abruptly.
func (w *Worker) Drop() {
	w.once.Do(func() {
		close(w.done)
		w.ws.Close()
	})
}

// Send writes one JSON message (or raw bytes, as a text frame) to the worker.
func (w *Worker) Send(v any) error {
	var b []byte
	switch x := v.(type) {
	case []byte:
		b = x
	case string:
		b = []byte(x)
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return err
		}
	}
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	select {
	case <-w.done:
		return ErrClosed
	default:
	}
	return w.ws.WriteMessage(websocket.TextMessage, b)
}

// Run registers a call and sends it. req must hold "call_id"; "op"
// defaults to "run".
func (w *Worker) Run(req map[string]any) (*Call, error) {
	id, _ := req["call_id"].(string)
	if id == "" {
		return nil, fmt.Errorf("Run needs a string call_id")
	}
	if _, ok := req["op"]; !ok {
		req["op"] = protocol.OpRun
	}
	c := w.Expect(id)
	return c, w.Send(req)
}

// Expect registers a call id whose frames the caller wants to read,
// without sending anything.
func (w *Worker) Expect(id string) *Call {
	c := &Call{ID: id, worker: w, messages: make(chan Message, 4096)}
	if w.engine != nil {
		c.messages = make(chan Message, 1<<20)
		c.resumable = true
		w.engine.keep(w, c)
	}
	w.mu.Lock()
	w.calls[id] = c
	w.mu.Unlock()
	return c
}

// Cancel sends a cancel for the call.
func (w *Worker) Cancel(id string) error {
	return w.Send(map[string]any{"op": protocol.OpCancel, "call_id": id})
}

// Stray returns the next frame that belonged to no registered call.
func (w *Worker) Stray(ctx context.Context) (Message, error) {
	select {
	case m := <-w.other:
		return m, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	}
}

// Call is one call's frames, in the order the worker sent them.
type Call struct {
	ID       string
	worker   *Worker
	messages chan Message

	// With the resume extension, the call outlives its connection: the
	// engine counts its frames (heartbeats aside) to answer a resume.
	resumable bool
	seq       atomic.Int64
}

func (c *Call) deliver(m Message) {
	if m.Event != "heartbeat" {
		c.seq.Add(1)
	}
	if c.resumable {
		c.messages <- m // a buffer of a million frames: a test that fills it is wrong
		return
	}
	select {
	case c.messages <- m:
	case <-c.worker.done:
	}
}

// Seq is how many frames of the call the engine has received, heartbeats
// aside: the number a resume answer continues after.
func (c *Call) Seq() int64 { return c.seq.Load() }

// Next returns the call's next frame.
func (c *Call) Next(ctx context.Context) (Message, error) {
	select {
	case m := <-c.messages:
		return m, nil
	default:
	}
	var gone <-chan struct{} // a resumable call: a new connection may resume it
	if !c.resumable {
		gone = c.worker.done
	}
	select {
	case m := <-c.messages:
		return m, nil
	case <-gone:
		select {
		case m := <-c.messages:
			return m, nil
		default:
			return Message{}, ErrClosed
		}
	case <-ctx.Done():
		return Message{}, fmt.Errorf("call %s: %w", c.ID, ctx.Err())
	}
}

// Wait reads the call's frames up to its answer and returns the answer and
// the events before it (heartbeats included).
func (c *Call) Wait(ctx context.Context) (answer Message, events []Message, err error) {
	for {
		m, err := c.Next(ctx)
		if err != nil {
			return Message{}, events, err
		}
		if m.IsAnswer() {
			if !c.resumable { // a resumed call may get a frame too many: a test's to see
				c.worker.mu.Lock()
				delete(c.worker.calls, c.ID)
				c.worker.mu.Unlock()
			}
			return m, events, nil
		}
		events = append(events, m)
	}
}

// WaitTimeout is Wait with a timeout.
func (c *Call) WaitTimeout(d time.Duration) (Message, []Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.Wait(ctx)
}

// Flood sends the same frame n times as fast as the connection takes them.
func (w *Worker) Flood(frame []byte, n int) error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	for i := 0; i < n; i++ {
		if err := w.ws.WriteMessage(websocket.TextMessage, frame); err != nil {
			return err
		}
	}
	return nil
}

// Tally counts the frames of calls sent without Run or Expect (with Send
// or Flood), for tests that send thousands of calls, where a Call each
// would cost too much. It keeps each call's answer and counts its events.
type Tally struct {
	mu       sync.Mutex
	answers  map[string]Message
	events   map[string]map[string]int // call id -> event -> count
	late     int                       // frames of a call after its answer
	answered chan struct{}             // signalled on each answer
}

// StartTally makes frames for unregistered calls go to the returned Tally
// instead of Stray.
func (w *Worker) StartTally() *Tally {
	t := &Tally{answers: map[string]Message{}, events: map[string]map[string]int{}, answered: make(chan struct{}, 1)}
	w.mu.Lock()
	w.tally = t
	w.mu.Unlock()
	return t
}

func (t *Tally) add(m Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, done := t.answers[m.CallID]; done {
		t.late++
		return
	}
	if m.IsAnswer() {
		t.answers[m.CallID] = m
		select {
		case t.answered <- struct{}{}:
		default:
		}
		return
	}
	if t.events[m.CallID] == nil {
		t.events[m.CallID] = map[string]int{}
	}
	t.events[m.CallID][m.Event]++
}

// WaitAnswers waits until n calls are answered.
func (t *Tally) WaitAnswers(ctx context.Context, n int) error {
	for {
		t.mu.Lock()
		got := len(t.answers)
		t.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-t.answered:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d calls answered: %w", got, n, ctx.Err())
		}
	}
}

// Answer returns a call's answer, if it came.
func (t *Tally) Answer(id string) (Message, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.answers[id]
	return m, ok
}

// Answers returns every answer so far, by call id.
func (t *Tally) Answers() map[string]Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]Message, len(t.answers))
	for k, v := range t.answers {
		out[k] = v
	}
	return out
}

// Events counts a call's events of one kind ("heartbeat", "started", ...).
func (t *Tally) Events(id, event string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events[id][event]
}

// EventsOfKind counts the events of one kind over all calls.
func (t *Tally) EventsOfKind(event string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, byKind := range t.events {
		n += byKind[event]
	}
	return n
}

// Late counts frames that arrived for a call after its answer.
func (t *Tally) Late() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.late
}
