// Package hold keeps a call's output for an engine that may not have it
// yet: the resume extension (docs/resume.md). Every
// frame a call sends gets the next sequence number of that call (1, 2, ...;
// heartbeats are not frames of the journal). While the connection is up,
// frames go straight out and the last ones sent are retained, since the
// engine may not have read them when the connection drops. While it is
// down, frames are kept: in memory up to a bound, then in a spill file in
// the state directory up to a second bound; past that, Append blocks, so
// the call's relay stops reading its runner's output and the runner waits
// on its pipe. Nothing is ever dropped while the journal is open. On
// reconnection, Replay sends what follows the engine's last sequence number,
// in order, then the journal is live again.
package hold

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Sender is an attached connection: Send queues one frame, which then
// belongs to the connection, and reports false once it is gone.
type Sender interface {
	Send(frame []byte) bool
}

// Limits bound what one journal keeps.
type Limits struct {
	Memory int64 // bytes of kept frames in memory before the rest spills
	Disk   int64 // bytes of the spill file before Append blocks
	Retain int64 // bytes of sent frames retained for a replay
	// Shared bounds the spill files of all journals given it together
	// (budget.go); nil: only Disk bounds them.
	Shared *Budget
}

// Errors of Replay.
var (
	// ErrGone: the engine asked for frames the journal no longer retains.
	ErrGone = errors.New("the engine asked for frames this worker no longer keeps")
	// ErrAhead: the engine claims frames the call never sent.
	ErrAhead = errors.New("the engine claims more frames than the call sent")
	// ErrLost: the connection was lost during the replay; the frames stay kept.
	ErrLost = errors.New("the connection was lost during the replay")
	// ErrClosed: the journal was closed.
	ErrClosed = errors.New("the journal is closed")
)

type frame struct {
	seq  int64
	data []byte
}

// Journal is one call's frames. Its methods are safe for concurrent use;
// frames are numbered in the order Append is called.
type Journal struct {
	dir string // where a spill file is made
	lim Limits

	mu   sync.Mutex
	room *sync.Cond // signalled when kept frames leave, a connection comes, or the journal closes

	next      int64   // the sequence number of the next frame
	sent      []frame // frames handed to a connection, retained; contiguous, ending at lastSent
	sentBytes int64
	lastSent  int64
	kept      []frame // frames not sent yet, in memory; they precede the spill file's
	keptBytes int64

	spill      *os.File // frames after kept, each an 8-byte length and its bytes
	spillRead  int64    // offset of the next unread frame
	spillEnd   int64    // offset after the last frame
	spillFirst int64    // sequence number of the frame at spillRead
	spillCount int64    // frames in the file not read yet
	spillErr   error    // the last write or read error: the file takes no more

	live      Sender // nil while held
	replaying bool   // a replay is sending what was kept; Append keeps
	heldSince time.Time
	answer    int64 // sequence number of the call's answer, 0 until appended
	delivered chan struct{}
	closed    bool

	peakMemory int64
	peakDisk   int64
	waiting    bool  // an Append waits for room on disk
	charged    int64 // bytes of the spill file taken from lim.Shared
}

// New makes a live journal on s. dir is where a spill file goes (created
// 0700 if missing).
func New(s Sender, dir string, lim Limits) *Journal {
	j := &Journal{dir: dir, lim: lim, next: 1, live: s, delivered: make(chan struct{})}
	j.room = sync.NewCond(&j.mu)
	return j
}

// Append numbers frame and sends it, or keeps it while the journal is
// held. The journal owns frame from now on. answer marks the call's last
// frame. While held and over the disk bound, Append waits for room (the
// caller, a call's relay, stops reading its runner's output meanwhile).
func (j *Journal) Append(data []byte, answer bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for {
		if j.closed {
			return
		}
		if j.live != nil && !j.replaying && len(j.kept) == 0 && j.spillCount == 0 {
			seq := j.number(answer)
			j.sendLocked(frame{seq, data}, bytes.Clone(data))
			return
		}
		size := int64(len(data))
		if j.spillCount == 0 && (j.keptBytes+size <= j.lim.Memory || len(j.kept) == 0) {
			j.kept = append(j.kept, frame{j.number(answer), data})
			j.keptBytes += size
			j.peakMemory = max(j.peakMemory, j.keptBytes+j.sentBytes)
			return
		}
		shared, gen := true, uint64(0)
		if j.spillErr == nil && (j.spillCount == 0 || j.spillEnd-j.spillRead+8+size <= j.lim.Disk) {
			if shared, gen = j.lim.Shared.take(8 + size); shared {
				j.charged += 8 + size
				if j.spillLocked(j.number(answer), data) {
					return
				}
				j.settleLocked()
				j.next-- // not written: the number is taken again below
				if answer {
					j.answer = 0
				}
			}
		}
		j.waiting = true
		if shared {
			j.room.Wait()
		} else {
			// The held calls' spill files together are at their bound:
			// room comes from another journal's replay, or this one's.
			j.mu.Unlock()
			j.lim.Shared.wait(gen)
			j.mu.Lock()
		}
		j.waiting = false
	}
}

func (j *Journal) number(answer bool) int64 {
	seq := j.next
	j.next++
	if answer {
		j.answer = seq
	}
	return seq
}

// sendLocked retains f and hands out, a copy of it the connection may
// recycle, to the live connection; a connection found gone leaves the
// journal held.
func (j *Journal) sendLocked(f frame, out []byte) {
	j.retainLocked(f)
	s := j.live
	if !s.Send(out) {
		j.detachLocked(s)
		return
	}
	if j.answer != 0 && f.seq >= j.answer {
		j.deliveredLocked()
	}
}

func (j *Journal) retainLocked(f frame) {
	j.sent = append(j.sent, f)
	j.sentBytes += int64(len(f.data))
	j.lastSent = f.seq
	j.peakMemory = max(j.peakMemory, j.keptBytes+j.sentBytes)
	// Keep at least the last frame, and at most Retain bytes beyond it.
	for len(j.sent) > 1 && j.sentBytes-int64(len(j.sent[0].data)) >= j.lim.Retain {
		j.sentBytes -= int64(len(j.sent[0].data))
		j.sent[0] = frame{}
		j.sent = j.sent[1:]
	}
}

func (j *Journal) deliveredLocked() {
	select {
	case <-j.delivered:
	default:
		close(j.delivered)
	}
}

// spillLocked writes one frame at the end of the spill file, making it
// first. It reports false (and remembers why) when the disk takes no more.
func (j *Journal) spillLocked(seq int64, data []byte) bool {
	if j.spill == nil {
		if err := os.MkdirAll(j.dir, 0o700); err != nil {
			j.spillErr = err
			return false
		}
		f, err := os.CreateTemp(j.dir, "call-*.spill")
		if err != nil {
			j.spillErr = err
			return false
		}
		j.spill, j.spillRead, j.spillEnd = f, 0, 0
	}
	if j.spillCount == 0 {
		j.spillFirst = seq
	}
	var head [8]byte
	binary.BigEndian.PutUint64(head[:], uint64(len(data)))
	if _, err := j.spill.WriteAt(append(head[:], data...), j.spillEnd); err != nil {
		j.spillErr = fmt.Errorf("writing the spill file: %w", err)
		return false
	}
	j.spillEnd += 8 + int64(len(data))
	j.spillCount++
	j.peakDisk = max(j.peakDisk, j.spillEnd-j.spillRead)
	return true
}

// takeLocked removes the next kept frame: from memory, then from the file.
func (j *Journal) takeLocked() (frame, bool, error) {
	if len(j.kept) > 0 {
		f := j.kept[0]
		j.kept[0] = frame{}
		j.kept = j.kept[1:]
		j.keptBytes -= int64(len(f.data))
		return f, true, nil
	}
	if j.spillCount == 0 {
		j.removeSpillLocked()
		return frame{}, false, nil
	}
	var head [8]byte
	if _, err := j.spill.ReadAt(head[:], j.spillRead); err != nil {
		return frame{}, false, fmt.Errorf("reading the spill file: %w", err)
	}
	data := make([]byte, binary.BigEndian.Uint64(head[:]))
	if _, err := j.spill.ReadAt(data, j.spillRead+8); err != nil && !errors.Is(err, io.EOF) {
		return frame{}, false, fmt.Errorf("reading the spill file: %w", err)
	}
	f := frame{j.spillFirst, data}
	j.spillRead += 8 + int64(len(data))
	j.spillFirst++
	j.spillCount--
	if j.spillCount == 0 {
		j.removeSpillLocked()
	}
	j.settleLocked()
	return f, true, nil
}

// removeSpillLocked deletes the spill file once nothing in it is unread.
func (j *Journal) removeSpillLocked() {
	if j.spill == nil {
		return
	}
	j.spill.Close()
	os.Remove(j.spill.Name())
	j.spill, j.spillRead, j.spillEnd, j.spillCount, j.spillErr = nil, 0, 0, 0, nil
	j.settleLocked()
}

// settleLocked gives lim.Shared back what the spill file no longer holds.
func (j *Journal) settleLocked() {
	if held := j.spillEnd - j.spillRead; j.charged > held {
		j.lim.Shared.give(j.charged - held)
		j.charged = held
	}
}

// wakeLocked wakes an Append waiting for room: on this journal, or on the
// shared bound.
func (j *Journal) wakeLocked() {
	j.room.Broadcast()
	j.lim.Shared.kick()
}

// Detach holds the journal: the connection is gone, and frames are kept
// from now on.
func (j *Journal) Detach() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.detachLocked(j.live)
}

func (j *Journal) detachLocked(s Sender) {
	if j.live == nil || j.live != s {
		return
	}
	j.live, j.replaying = nil, false
	j.heldSince = time.Now()
}

// Replay sends, on s, every frame after the engine's last sequence number
// after, in order, then makes s the journal's live connection. Frames
// appended meanwhile follow the replayed ones. It returns ErrGone or
// ErrAhead without sending anything when the engine's number cannot be
// served, and ErrLost when s is gone before the end (the journal is held
// again, nothing dropped).
func (j *Journal) Replay(s Sender, after int64) error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ErrClosed
	}
	if after > j.next-1 || after < 0 {
		j.mu.Unlock()
		return fmt.Errorf("%w: it has %d, the call sent %d", ErrAhead, after, j.next-1)
	}
	oldest := j.next
	switch {
	case len(j.sent) > 0:
		oldest = j.sent[0].seq
	case len(j.kept) > 0:
		oldest = j.kept[0].seq
	case j.spillCount > 0:
		oldest = j.spillFirst
	}
	if after+1 < oldest {
		j.mu.Unlock()
		return fmt.Errorf("%w: it has %d, the oldest kept is %d", ErrGone, after, oldest)
	}
	// What the engine has is acknowledged; the rest of the retained frames
	// go out again, before what was kept.
	var again []frame
	for _, f := range j.sent {
		if f.seq > after {
			again = append(again, f)
			j.keptBytes += int64(len(f.data))
		}
	}
	j.kept = append(again, j.kept...)
	j.sent, j.sentBytes = nil, 0
	j.live, j.replaying = s, true
	j.mu.Unlock()
	for {
		j.mu.Lock()
		if j.closed || j.live != s {
			j.mu.Unlock()
			return ErrLost
		}
		f, ok, err := j.takeLocked()
		if err != nil {
			j.detachLocked(s)
			j.mu.Unlock()
			return err
		}
		if !ok {
			j.replaying = false
			j.wakeLocked()
			j.mu.Unlock()
			return nil
		}
		j.retainLocked(f)
		j.wakeLocked()
		out := bytes.Clone(f.data)
		j.mu.Unlock()
		if !s.Send(out) {
			j.mu.Lock()
			j.detachLocked(s)
			j.mu.Unlock()
			return ErrLost
		}
		j.mu.Lock()
		if j.answer != 0 && f.seq >= j.answer {
			j.deliveredLocked()
		}
		j.mu.Unlock()
	}
}

// Discard drops everything kept and makes s the live connection: the engine
// cancelled the call. It reports whether the call's answer was among what
// was dropped (the caller then answers the cancel itself).
func (j *Journal) Discard(s Sender) (answered bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	answered = j.answer != 0
	j.answer = 0
	j.kept, j.keptBytes, j.sent, j.sentBytes = nil, 0, nil, 0
	j.removeSpillLocked()
	j.live, j.replaying = s, false
	j.wakeLocked()
	return answered
}

// Close drops everything kept and removes the spill file; Append does
// nothing from now on. The call is stopped, or its hold ended.
func (j *Journal) Close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	j.kept, j.keptBytes, j.sent, j.sentBytes = nil, 0, nil, 0
	j.removeSpillLocked()
	j.live = nil
	j.deliveredLocked()
	j.wakeLocked()
}

// Delivered is closed once the call's answer went to a live connection, or
// the journal was closed.
func (j *Journal) Delivered() <-chan struct{} { return j.delivered }

// Live is the connection frames go to, nil while held (or replaying).
func (j *Journal) Live() Sender {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.replaying {
		return nil
	}
	return j.live
}

// Stats is what a journal holds now, for status and metrics.
type Stats struct {
	Held       bool      // no live connection
	HeldSince  time.Time // when it was last held
	Seq        int64     // the last frame's sequence number
	Answered   bool      // the call's answer is among its frames
	Memory     int64     // bytes of frames in memory: kept and retained
	Disk       int64     // bytes of the spill file not yet replayed
	PeakMemory int64
	PeakDisk   int64
	Paused     bool // an Append waits for room: the runner's output is not read
}

// Stats reports what the journal holds now.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return Stats{
		Held:       j.live == nil || j.replaying,
		HeldSince:  j.heldSince,
		Seq:        j.next - 1,
		Answered:   j.answer != 0,
		Memory:     j.keptBytes + j.sentBytes,
		Disk:       j.spillEnd - j.spillRead,
		PeakMemory: j.peakMemory,
		PeakDisk:   j.peakDisk,
		Paused:     j.waiting,
	}
}
