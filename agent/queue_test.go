package agent

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/logging"
)

func TestCallQueueIsFIFOAndSkipsCancelledCalls(t *testing.T) {
	var q callQueue
	calls := make([]*call, 5)
	for i := range calls {
		calls[i] = &call{id: fmt.Sprint(i), size: 10}
		q.push(calls[i])
	}
	q.remove(calls[1])
	q.remove(calls[1]) // twice is once
	if q.n != 4 || q.bytes != 40 {
		t.Fatalf("after a cancel: %d waiting, %d bytes", q.n, q.bytes)
	}
	var order []string
	for c := q.pop(); c != nil; c = q.pop() {
		order = append(order, c.id)
		if c.state != callVetting {
			t.Errorf("popped call %s is %s, want vetting (it holds a slot)", c.id, c.state)
		}
	}
	if got := strings.Join(order, ","); got != "0,2,3,4" {
		t.Errorf("popped %s, want 0,2,3,4", got)
	}
	if q.n != 0 || q.bytes != 0 || len(q.waiting) != 0 {
		t.Errorf("empty queue holds n=%d bytes=%d slice=%d", q.n, q.bytes, len(q.waiting))
	}
}

func TestCallQueueBound(t *testing.T) {
	var q callQueue
	for i := 0; i < maxQueuedCalls; i++ {
		if !q.fits(100) {
			t.Fatalf("call %d did not fit", i)
		}
		q.push(&call{size: 100})
	}
	if q.fits(1) {
		t.Error("a call beyond maxQueuedCalls fits")
	}
	msg := q.fullError(4)
	for _, want := range []string{"10000 calls", "--parallel 4", "at most 10000", "max_parallel"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	// Many pops compact the slice instead of keeping every call.
	for i := 0; i < maxQueuedCalls-10; i++ {
		q.pop()
	}
	if len(q.waiting) > 5000 {
		t.Errorf("after %d pops the queue still holds a slice of %d", maxQueuedCalls-10, len(q.waiting))
	}
	if got := len(q.takeAll()); got != 10 || q.n != 0 {
		t.Errorf("takeAll gave %d calls and left %d", got, q.n)
	}

	var big callQueue
	if !big.fits(maxQueuedBytes) || big.fits(maxQueuedBytes+1) {
		t.Error("the byte bound is not maxQueuedBytes")
	}
}

func TestLoggedIDIsCut(t *testing.T) {
	if got := logging.Cut("c1", maxLoggedID); got != "c1" {
		t.Errorf("short id = %q", got)
	}
	long := strings.Repeat("é", 1000) // 2000 bytes, cut inside a rune
	got := logging.Cut(long, maxLoggedID)
	if len(got) > maxLoggedID+32 || !strings.HasSuffix(got, "…(2000 bytes)") || !strings.HasPrefix(got, "éé") {
		t.Errorf("long id logged as %q", got)
	}
}
