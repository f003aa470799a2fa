package hold

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// conn is a connection that takes frames until it is cut.
type conn struct {
	mu     sync.Mutex
	frames []string
	cut    bool
}

func (c *conn) Send(b []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return false
	}
	c.frames = append(c.frames, string(b))
	return true
}

func (c *conn) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.frames...)
}

func line(i int) []byte {
	return []byte(fmt.Sprintf(`{"call_id":"c","event":"stream","values":{"i":%d}}`, i))
}

func spillFiles(t *testing.T, dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(entries)
}

// Frames kept while held, in memory and then on disk, go out once each and
// in order after the engine's last number; the spill file is then removed.
func TestHeldFramesReplayOnceInOrder(t *testing.T) {
	dir := t.TempDir() + "/held"
	first := &conn{}
	j := New(first, dir, Limits{Memory: 1000, Disk: 1 << 20})
	for i := 0; i < 10; i++ {
		j.Append(line(i), false)
	}
	first.mu.Lock()
	first.cut = true
	first.mu.Unlock()
	j.Append(line(10), false) // the send fails: held from here
	for i := 11; i < 200; i++ {
		j.Append(line(i), false)
	}
	j.Append([]byte(`{"call_id":"c","ok":true}`), true)
	st := j.Stats()
	if !st.Held || st.Disk == 0 || st.Memory > 1000+100 {
		t.Fatalf("held journal: %+v; want held, spilled, memory within its bounds", st)
	}
	if spillFiles(t, dir) != 1 {
		t.Fatalf("no spill file in %s", dir)
	}
	select {
	case <-j.Delivered():
		t.Fatal("delivered while held")
	default:
	}
	// The engine got frames 1..8 (0-based values 0..7).
	second := &conn{}
	if err := j.Replay(second, 8); err != nil {
		t.Fatal(err)
	}
	j.Append(line(999), false) // live again: after the replay
	got := second.got()
	if len(got) != 200-8+1+1 {
		t.Fatalf("replayed %d frames, want %d", len(got), 200-8+2)
	}
	for k, i := 0, 8; i < 200; i, k = i+1, k+1 {
		if got[k] != string(line(i)) {
			t.Fatalf("frame %d is %s, want %s", k, got[k], line(i))
		}
	}
	if got[192] != `{"call_id":"c","ok":true}` || got[193] != string(line(999)) {
		t.Fatalf("the tail is %q", got[190:])
	}
	select {
	case <-j.Delivered():
	default:
		t.Fatal("the answer went out but the journal does not say delivered")
	}
	// What was replayed stays retained until the engine says it has it,
	// or the journal closes.
	if spillFiles(t, dir) == 0 {
		t.Fatal("the replayed frames are no longer retained")
	}
	j.Close()
	if n := spillFiles(t, dir); n != 0 {
		t.Fatalf("%d spill files left after Close", n)
	}
}

// Over the disk bound, Append waits (the runner's output is not read)
// instead of dropping, and goes on once a replay makes room.
func TestFullDiskPausesAppend(t *testing.T) {
	dir := t.TempDir()
	c := &conn{}
	j := New(c, dir, Limits{Memory: 100, Disk: 500})
	j.Detach()
	done := make(chan struct{})
	go func() {
		for i := 0; i < 100; i++ {
			j.Append(line(i), false)
		}
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !j.Stats().Paused {
		if time.Now().After(deadline) {
			t.Fatal("Append never paused at the disk bound")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("all frames were taken past the disk bound")
	default:
	}
	if st := j.Stats(); st.Disk > 500 {
		t.Fatalf("spill file holds %d bytes, over its bound of 500", st.Disk)
	}
	second := &conn{}
	if err := j.Replay(second, 0); err != nil {
		t.Fatal(err)
	}
	<-done
	got := second.got()
	if len(got) != 100 {
		t.Fatalf("%d frames arrived, want 100", len(got))
	}
	for i, g := range got {
		if g != string(line(i)) {
			t.Fatalf("frame %d is %s", i, g)
		}
	}
}

// An engine that asks for frames older than what is retained (the bounds
// made room for newer ones), or claims frames never sent, is told so and
// nothing is sent.
func TestReplayRefusesWhatItCannotServe(t *testing.T) {
	c := &conn{}
	j := New(c, t.TempDir(), Limits{Memory: 100, Disk: 300})
	for i := 0; i < 50; i++ {
		j.Append(line(i), false)
	}
	j.Detach()
	if err := j.Replay(&conn{}, 0); err == nil {
		t.Fatal("a replay from frame 1 was accepted with only the last frames retained")
	}
	if err := j.Replay(&conn{}, 51); err == nil {
		t.Fatal("an engine claiming frame 51 of 50 was accepted")
	}
	second := &conn{}
	if err := j.Replay(second, 50); err != nil || len(second.got()) != 0 {
		t.Fatalf("replay from the last frame: %v, %d frames", err, len(second.got()))
	}
}

// A cancelled call's kept frames are dropped; its spill file goes too.
func TestDiscardDropsEverything(t *testing.T) {
	dir := t.TempDir()
	j := New(&conn{}, dir, Limits{Memory: 10, Disk: 1 << 20})
	j.Detach()
	for i := 0; i < 20; i++ {
		j.Append(line(i), false)
	}
	j.Append([]byte(`{"call_id":"c","ok":true}`), true)
	second := &conn{}
	if !j.Discard(second) {
		t.Fatal("Discard does not say the answer was dropped")
	}
	if spillFiles(t, dir) != 0 || len(second.got()) != 0 {
		t.Fatal("kept frames survived the discard")
	}
	j.Append([]byte(`{"call_id":"c","ok":false}`), true)
	if got := second.got(); len(got) != 1 {
		t.Fatalf("after the discard: %q", got)
	}
}

// cutAfter takes n frames, then is gone.
type cutAfter struct {
	conn
	n int
}

func (c *cutAfter) Send(b []byte) bool {
	if len(c.got()) >= c.n {
		return false
	}
	return c.conn.Send(b)
}

// A connection lost in the middle of a replay leaves the journal held with
// nothing dropped: the next replay, from what the engine got, completes it.
func TestReplayCutShortResumesAgain(t *testing.T) {
	j := New(&conn{}, t.TempDir(), Limits{Memory: 500, Disk: 1 << 20})
	j.Detach()
	for i := 0; i < 100; i++ {
		j.Append(line(i), false)
	}
	first := &cutAfter{n: 30}
	if err := j.Replay(first, 0); err != ErrLost {
		t.Fatalf("replay over a connection cut after 30 frames: %v, want ErrLost", err)
	}
	if !j.Stats().Held {
		t.Fatal("not held after the connection was lost mid-replay")
	}
	j.Append(line(100), false) // the call goes on meanwhile, and ends
	j.Append([]byte(`{"call_id":"c","ok":true}`), true)
	// The engine read 25 of the 30 frames it was sent.
	second := &conn{}
	if err := j.Replay(second, 25); err != nil {
		t.Fatal(err)
	}
	got := append(first.got()[:25], second.got()...)
	if len(got) != 102 {
		t.Fatalf("%d frames in all, want 102", len(got))
	}
	for i := 0; i <= 100; i++ {
		if got[i] != string(line(i)) {
			t.Fatalf("frame %d is %s", i, got[i])
		}
	}
	if got[101] != `{"call_id":"c","ok":true}` {
		t.Fatalf("the last frame is %s, want the answer", got[101])
	}
	select {
	case <-j.Delivered():
	default:
		t.Fatal("the answer went out but is not delivered")
	}
}

// Frames sent on a connection that dies are retained past the memory bound,
// on disk: an engine that read only the first of thousands gets all the
// others again, once each and in order, whatever was in flight.
func TestSentFramesAreRetainedOnDisk(t *testing.T) {
	dir := t.TempDir() + "/held"
	first := &conn{}
	j := New(first, dir, Limits{Memory: 1000, Disk: 1 << 20})
	defer j.Close()
	for i := 0; i < 2000; i++ {
		j.Append(line(i), false)
	}
	if len(first.got()) != 2000 {
		t.Fatalf("%d frames went out live, want 2000", len(first.got()))
	}
	if st := j.Stats(); st.Memory > 1000+100 || st.Disk == 0 {
		t.Fatalf("live journal: %+v; want memory within its bound, the rest on disk", st)
	}
	j.Detach()
	j.Append(line(2000), false)
	second := &conn{}
	if err := j.Replay(second, 1); err != nil {
		t.Fatal(err)
	}
	got := second.got()
	if len(got) != 2000 {
		t.Fatalf("replayed %d frames, want 2000", len(got))
	}
	for k, g := range got {
		if g != string(line(k+1)) {
			t.Fatalf("replayed frame %d is %s, want %s", k, g, line(k+1))
		}
	}
	// The engine has frames up to 1500 now: a second outage replays the rest.
	j.Detach()
	third := &conn{}
	if err := j.Replay(third, 1500); err != nil {
		t.Fatal(err)
	}
	if got := third.got(); len(got) != 501 || got[0] != string(line(1500)) || got[500] != string(line(2000)) {
		t.Fatalf("the second replay sent %d frames", len(got))
	}
}

// Past the disk bound a live journal lets its oldest sent frames go rather
// than hold up the call, and keeps its spill files within the bound.
func TestRetainedFramesStayWithinTheBounds(t *testing.T) {
	dir := t.TempDir()
	j := New(&conn{}, dir, Limits{Memory: 500, Disk: 4000})
	defer j.Close()
	for i := 0; i < 5000; i++ {
		j.Append(line(i), false)
		if st := j.Stats(); st.Disk > 4000 || st.Memory > 500+100 {
			t.Fatalf("after frame %d: %+v; over the bounds", i, st)
		}
	}
	if n := spillFiles(t, dir); n == 0 || n > 5 {
		t.Fatalf("%d spill files", n)
	}
	j.Detach()
	if err := j.Replay(&conn{}, 10); !errors.Is(err, ErrGone) {
		t.Fatalf("a replay of frames long gone: %v, want ErrGone", err)
	}
	second := &conn{}
	if err := j.Replay(second, 4990); err != nil || len(second.got()) != 10 {
		t.Fatalf("a replay of the last 10 frames: %v, %d frames", err, len(second.got()))
	}
}

// Where the engine acknowledges answers, an answer sent is delivered only
// once acknowledged; one that went to a connection that died is delivered
// by a replay from a number that includes it, or by the acknowledgement of
// its replay.
func TestAcknowledgedAnswer(t *testing.T) {
	delivered := func(j *Journal) bool {
		select {
		case <-j.Delivered():
			return true
		default:
			return false
		}
	}
	first := &conn{}
	j := New(first, t.TempDir(), Limits{Memory: 1 << 20, Disk: 1 << 20})
	defer j.Close()
	j.SetAck(true)
	if j.Ack() {
		t.Fatal("an acknowledgement before the answer was taken")
	}
	j.Append(line(0), false)
	j.Append([]byte(`{"call_id":"c","ok":true}`), true)
	if delivered(j) {
		t.Fatal("delivered before the engine acknowledged it")
	}
	j.Detach()
	if j.Ack() || delivered(j) {
		t.Fatal("an acknowledgement taken while held")
	}
	second := &conn{}
	if err := j.Replay(second, 1); err != nil {
		t.Fatal(err)
	}
	if len(second.got()) != 1 || delivered(j) {
		t.Fatalf("after the replay of the answer: %q, delivered %v; want the answer, not delivered", second.got(), delivered(j))
	}
	if !j.Ack() || !delivered(j) {
		t.Fatal("the acknowledgement of the replayed answer was not taken")
	}

	// A replay from the answer's number: the engine has it.
	k := New(&conn{}, t.TempDir(), Limits{Memory: 1 << 20, Disk: 1 << 20})
	defer k.Close()
	k.SetAck(true)
	k.Append([]byte(`{"call_id":"c","ok":true}`), true)
	k.Detach()
	third := &conn{}
	if err := k.Replay(third, 1); err != nil || len(third.got()) != 0 || !delivered(k) {
		t.Fatalf("a replay after the answer: %v, %q, delivered %v; want nothing sent, delivered", err, third.got(), delivered(k))
	}
}

// waitPaused waits for j's Append to wait for room.
func waitPaused(t *testing.T, j *Journal) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !j.Stats().Paused {
		if time.Now().After(deadline) {
			t.Fatal("Append never paused")
		}
		time.Sleep(time.Millisecond)
	}
}

// The held calls' spill files together stay within their shared bound
// (--held-disk-max), though each is within its own: the journal whose
// frame would pass it waits, and goes on once another journal gives room
// back (its spill files gone: closed, discarded, or replayed and then
// acknowledged by a later continue).
func TestSharedBudgetPausesAcrossJournals(t *testing.T) {
	dir := t.TempDir()
	budget := NewBudget(1000)
	lim := Limits{Memory: 100, Disk: 1 << 20, Shared: budget}
	first, second := New(&conn{}, dir, lim), New(&conn{}, dir, lim)
	first.Detach()
	second.Detach()
	for i := 0; i < 30 && budget.Used() < 800; i++ {
		first.Append(line(i), false)
	}
	if budget.Used() < 800 || first.Stats().Disk != budget.Used() {
		t.Fatalf("the first journal spilled %d bytes, the budget counts %d", first.Stats().Disk, budget.Used())
	}
	done := make(chan struct{})
	go func() {
		for i := 0; i < 10; i++ { // within the bound alone, not beside the first's
			second.Append(line(i), false)
		}
		close(done)
	}()
	waitPaused(t, second)
	select {
	case <-done:
		t.Fatal("the second journal spilled past the shared bound")
	default:
	}
	if used := budget.Used(); used > 1000 || used != first.Stats().Disk+second.Stats().Disk {
		t.Fatalf("the budget counts %d bytes (bound 1000); the spill files hold %d and %d", used, first.Stats().Disk, second.Stats().Disk)
	}
	first.Close()
	<-done // the first's spill files, gone with it, gave their room to the second
	second.Close()
	if used := budget.Used(); used != 0 {
		t.Errorf("the budget counts %d bytes after every spill file was replayed or dropped", used)
	}
}
