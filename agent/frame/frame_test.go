package frame

import (
	"runtime"
	"testing"
)

func TestRoundTripAllocatesNothing(t *testing.T) {
	line := []byte(`{"call_id":"c","event":"stream","values":{"i":1}}`)
	Put(append(Get(len(line)), line...)) // fill the pool
	allocs := testing.AllocsPerRun(1000, func() {
		Put(append(Get(len(line)), line...))
	})
	if allocs > 0 && !raceEnabled {
		t.Errorf("a pooled frame's round trip allocates %.1f times, want 0", allocs)
	}
}

func TestGetReusesWhatWasPut(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random")
	}
	put := append(Get(10), "0123456789"...)
	Put(put)
	got := Get(10)
	if len(got) != 0 {
		t.Fatalf("Get returned %d bytes, want an empty frame", len(got))
	}
	if cap(got) != cap(put) || &got[:1][0] != &put[0] {
		t.Errorf("Get after Put made a new frame, want the one put back")
	}
}

func TestLargeFramesStayOutOfThePool(t *testing.T) {
	big := Get(MaxPooled + 1)
	if len(big) != 0 || cap(big) < MaxPooled+1 {
		t.Fatalf("Get(MaxPooled+1): len %d cap %d, want an empty frame that holds it", len(big), cap(big))
	}
	Put(big)
	for range 100 {
		if f := Get(1); cap(f) > MaxPooled {
			t.Fatalf("Get(1) returned a frame of capacity %d; frames over %d must not be pooled", cap(f), MaxPooled)
		}
	}
}

func TestReleaseGivesOutsizedMemoryBack(t *testing.T) {
	var live, after runtime.MemStats
	msg := make([]byte, 4*Outsized)
	for i := range msg { // touch every page
		msg[i] = byte(i)
	}
	runtime.ReadMemStats(&live)
	runtime.KeepAlive(msg)
	msg = nil
	Release()
	runtime.ReadMemStats(&after)
	if got := int64(after.HeapReleased) - int64(live.HeapReleased); got < 2*Outsized {
		t.Errorf("Release gave back %d bytes after dropping a %d-byte message, want at least %d",
			got, 4*Outsized, 2*Outsized)
	}
}
