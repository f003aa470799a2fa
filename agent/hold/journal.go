// Package hold keeps a call's output for an engine that may not have it
// yet: the resume extension (docs/resume.md). Every
// frame a call sends gets the next sequence number of that call (1, 2, ...;
// heartbeats are not frames of the journal). While the connection is up,
// frames go straight out and stay retained: the engine may not have read
// them when the connection drops (the worker's outgoing queue and both
// sockets' buffers can hold tens of MiB), and only a later replay says
// which it has. While it is down, frames are kept. Both are kept in memory
// up to a bound, then in spill files in the state directory up to a second
// bound; past that, the oldest retained frames go, and when none is left to
// go Append blocks, so the call's relay stops reading its runner's output
// and the runner waits on its pipe. Nothing not yet sent is ever dropped
// while the journal is open. On reconnection, Replay sends what follows the
// engine's last sequence number, in order, then the journal is live again.
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

// Limits bound what one journal keeps: its frames in memory, then in spill
// files. Past both, the oldest frames already handed to a connection go
// (the engine can no longer ask for them); frames not handed to one yet
// never go: Append waits for room instead.
type Limits struct {
	Memory int64 // bytes of frames in memory
	Disk   int64 // bytes of spill files
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

// spillFile is one file frames spill to: records of an 8-byte length and
// the frame's bytes, appended. It goes once no segment points into it.
type spillFile struct {
	f    *os.File
	size int64 // where the next record goes
	refs int   // segments with frames in it
}

// segment is a run of consecutive frames, from first: in memory (mem), or
// records of a spill file from off to end.
type segment struct {
	first, n int64
	mem      []frame
	file     *spillFile
	off, end int64
}

func (s *segment) last() int64 { return s.first + s.n - 1 }

// cursor is where the frame after Journal.sent is, while frames wait to be
// sent: its segment and, in a spill file, its record's offset.
type cursor struct {
	seg *segment
	seq int64
	off int64
}

// Journal is one call's frames. Its methods are safe for concurrent use;
// frames are numbered in the order Append is called.
type Journal struct {
	dir string // where spill files are made
	lim Limits

	mu   sync.Mutex
	room *sync.Cond // signalled when frames can go, a connection comes, or the journal closes

	next int64 // the sequence number of the next frame
	// segs are the frames kept, in order, with no gap: those up to sent were
	// handed to a connection and are retained for a replay, the rest wait
	// for one. Retained frames go only when the engine says it has them
	// (Replay), when the call's frames are dropped, or to make room.
	segs   []*segment
	sent   int64 // the last frame handed to a connection; 0 for none
	cur    cursor
	memory int64        // bytes of frames in memory
	files  []*spillFile // the last one takes new records
	disk   int64        // bytes of the spill files
	// spillErr: the last write or read error of a spill file.
	spillErr error

	live      Sender // nil while held
	replaying bool   // a replay is sending what was kept; Append keeps
	heldSince time.Time
	answer    int64 // sequence number of the call's answer, 0 until appended
	delivered chan struct{}
	ack       bool // the engine acknowledges answers: delivered waits for Ack
	closed    bool

	peakMemory int64
	peakDisk   int64
	waiting    bool // an Append waits for room on disk
	// sharedGen is the shared budget's generation when it last refused
	// room (budget.go); 0 while it has not since the last frame stored.
	sharedGen  uint64
	sharedFull bool
}

// New makes a live journal on s. dir is where spill files go (created
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
		f := frame{j.next, data}
		if j.live != nil && !j.replaying && j.sent == j.next-1 {
			// Nothing waits: it goes out now, and is retained.
			inMemory, ok := j.storeLocked(f)
			if !ok {
				// No room even with every retained frame gone: this one
				// is all there is.
				j.dropThroughLocked(j.sent)
				j.pushMemLocked(f)
				inMemory = true
			}
			j.number(answer)
			j.sent = f.seq
			out := data
			if inMemory {
				out = bytes.Clone(data) // the connection may recycle what it sends
			}
			s := j.live
			if !s.Send(out) {
				j.detachLocked(s)
				return
			}
			if !j.ack && j.answer != 0 && f.seq >= j.answer {
				j.deliveredLocked()
			}
			return
		}
		if _, ok := j.storeLocked(f); ok {
			j.number(answer)
			return
		}
		j.waiting = true
		if j.sharedFull {
			// The spill files of every held call together are at their
			// bound: room comes from another journal, or from this one.
			gen := j.sharedGen
			j.mu.Unlock()
			j.lim.Shared.wait(gen)
			j.mu.Lock()
		} else {
			j.room.Wait()
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

// storeLocked keeps f after the last frame: in memory while it fits, else
// in a spill file, making room by dropping the oldest retained frames. It
// reports false when there is no room.
func (j *Journal) storeLocked(f frame) (inMemory, ok bool) {
	size := int64(len(f.data))
	j.sharedFull = false
	for {
		if j.memory == 0 || j.memory+size <= j.lim.Memory {
			j.pushMemLocked(f)
			return true, true
		}
		if j.spillErr == nil && !j.sharedFull && (j.disk == 0 || j.disk+8+size <= j.lim.Disk) {
			ok, gen := j.lim.Shared.take(8 + size)
			if !ok {
				j.sharedFull, j.sharedGen = true, gen
				continue // memory, if retained frames make room; else wait for the budget
			}
			if j.spillLocked(f) {
				return false, true
			}
			j.lim.Shared.give(8 + size)
			continue // the disk takes no more: memory, if retained frames make room
		}
		if !j.dropOldestLocked() {
			return false, false
		}
	}
}

// dropOldestLocked drops retained frames to make room: the first segment
// when it is all retained, else the first frame when it is in memory. It
// reports false when that frees nothing.
func (j *Journal) dropOldestLocked() bool {
	if len(j.segs) == 0 || j.segs[0].first > j.sent {
		return false
	}
	s := j.segs[0]
	if s.last() <= j.sent {
		j.removeFirstLocked()
		return true
	}
	if s.mem == nil {
		return false // the rest of its file waits to be sent: nothing frees
	}
	j.dropFirstFrameLocked()
	return true
}

func (j *Journal) pushMemLocked(f frame) {
	if n := len(j.segs); n > 0 && j.segs[n-1].mem != nil {
		s := j.segs[n-1]
		s.mem = append(s.mem, f)
		s.n++
	} else {
		j.segs = append(j.segs, &segment{first: f.seq, n: 1, mem: []frame{f}})
	}
	j.memory += int64(len(f.data))
	j.peakMemory = max(j.peakMemory, j.memory)
}

// spillLocked writes f at the end of a spill file. It reports false (and
// remembers why) when the disk takes no more.
func (j *Journal) spillLocked(f frame) bool {
	var file *spillFile
	if n := len(j.files); n > 0 && j.files[n-1].size < max(j.lim.Disk/4, 1) {
		file = j.files[n-1]
	} else {
		if err := os.MkdirAll(j.dir, 0o700); err != nil {
			j.spillErr = err
			return false
		}
		fd, err := os.CreateTemp(j.dir, "call-*.spill")
		if err != nil {
			j.spillErr = err
			return false
		}
		file = &spillFile{f: fd}
		j.files = append(j.files, file)
	}
	var head [8]byte
	binary.BigEndian.PutUint64(head[:], uint64(len(f.data)))
	if _, err := file.f.WriteAt(append(head[:], f.data...), file.size); err != nil {
		j.spillErr = fmt.Errorf("writing the spill file: %w", err)
		if file.refs == 0 {
			j.closeFileLocked(file)
		}
		return false
	}
	at := file.size
	file.size += 8 + int64(len(f.data))
	j.disk += 8 + int64(len(f.data))
	j.peakDisk = max(j.peakDisk, j.disk)
	if n := len(j.segs); n > 0 && j.segs[n-1].file == file && j.segs[n-1].end == at {
		s := j.segs[n-1]
		s.end = file.size
		s.n++
		return true
	}
	file.refs++
	j.segs = append(j.segs, &segment{first: f.seq, n: 1, file: file, off: at, end: file.size})
	return true
}

// removeFirstLocked drops the first segment whole.
func (j *Journal) removeFirstLocked() {
	s := j.segs[0]
	j.segs[0] = nil
	j.segs = j.segs[1:]
	if j.cur.seg == s {
		j.cur = cursor{}
	}
	for _, f := range s.mem {
		j.memory -= int64(len(f.data))
	}
	if s.file != nil {
		if s.file.refs--; s.file.refs == 0 {
			j.closeFileLocked(s.file)
		}
	}
}

// dropFirstFrameLocked drops the first frame of the first segment, which
// is in memory.
func (j *Journal) dropFirstFrameLocked() {
	s := j.segs[0]
	if s.n == 1 {
		j.removeFirstLocked()
		return
	}
	j.memory -= int64(len(s.mem[0].data))
	s.mem[0] = frame{}
	s.mem = s.mem[1:]
	s.first++
	s.n--
}

// dropThroughLocked drops every kept frame up to seq.
func (j *Journal) dropThroughLocked(seq int64) error {
	for len(j.segs) > 0 && j.segs[0].first <= seq {
		s := j.segs[0]
		switch {
		case s.last() <= seq:
			j.removeFirstLocked()
		case s.mem != nil:
			j.dropFirstFrameLocked()
		default:
			size, err := j.recordSize(s.file, s.off)
			if err != nil {
				return err
			}
			s.off += 8 + size
			s.first++
			s.n--
		}
	}
	return nil
}

func (j *Journal) closeFileLocked(file *spillFile) {
	file.f.Close()
	os.Remove(file.f.Name())
	j.disk -= file.size
	j.lim.Shared.give(file.size)
	for i, f := range j.files {
		if f == file {
			j.files = append(j.files[:i], j.files[i+1:]...)
			break
		}
	}
	if len(j.files) == 0 {
		j.spillErr = nil // a fresh file may be writable again
	}
}

// wakeLocked wakes an Append waiting for room: on this journal, or on the
// shared bound.
func (j *Journal) wakeLocked() {
	j.room.Broadcast()
	j.lim.Shared.kick()
}

func (j *Journal) recordSize(file *spillFile, off int64) (int64, error) {
	var head [8]byte
	if _, err := file.f.ReadAt(head[:], off); err != nil {
		return 0, fmt.Errorf("reading the spill file: %w", err)
	}
	return int64(binary.BigEndian.Uint64(head[:])), nil
}

// nextLocked reads the frame after sent, and moves sent past it. inMemory
// says the data is the journal's (a copy must go out).
func (j *Journal) nextLocked() (f frame, inMemory bool, err error) {
	want := j.sent + 1
	if j.cur.seg == nil || j.cur.seq != want || j.indexLocked(j.cur.seg) < 0 {
		j.cur = cursor{}
		for _, s := range j.segs {
			if s.first <= want && want <= s.last() {
				j.cur = cursor{seg: s, seq: s.first, off: s.off}
				break
			}
		}
		if j.cur.seg == nil {
			return frame{}, false, fmt.Errorf("frame %d is not kept", want)
		}
		for j.cur.seg.mem == nil && j.cur.seq < want {
			size, err := j.recordSize(j.cur.seg.file, j.cur.off)
			if err != nil {
				return frame{}, false, err
			}
			j.cur.off += 8 + size
			j.cur.seq++
		}
		j.cur.seq = want
	}
	s := j.cur.seg
	if s.mem != nil {
		f, inMemory = s.mem[want-s.first], true
	} else {
		size, err := j.recordSize(s.file, j.cur.off)
		if err != nil {
			return frame{}, false, err
		}
		data := make([]byte, size)
		if _, err := s.file.f.ReadAt(data, j.cur.off+8); err != nil && !errors.Is(err, io.EOF) {
			return frame{}, false, fmt.Errorf("reading the spill file: %w", err)
		}
		f = frame{want, data}
		j.cur.off += 8 + size
	}
	j.sent = want
	j.cur.seq++
	if j.cur.seq > s.last() {
		j.cur = cursor{}
		if i := j.indexLocked(s); i >= 0 && i+1 < len(j.segs) {
			next := j.segs[i+1]
			j.cur = cursor{seg: next, seq: next.first, off: next.off}
		}
	}
	return f, inMemory, nil
}

func (j *Journal) indexLocked(s *segment) int {
	for i, t := range j.segs {
		if t == s {
			return i
		}
	}
	return -1
}

func (j *Journal) deliveredLocked() {
	select {
	case <-j.delivered:
	default:
		close(j.delivered)
	}
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
// again, nothing dropped). The frames up to after are the engine's: they
// are dropped.
func (j *Journal) Replay(s Sender, after int64) error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ErrClosed
	}
	if after > j.sent || after < 0 {
		j.mu.Unlock()
		return fmt.Errorf("%w: it has %d, the worker sent it %d", ErrAhead, after, j.sent)
	}
	oldest := j.next
	if len(j.segs) > 0 {
		oldest = j.segs[0].first
	}
	if after+1 < oldest {
		j.mu.Unlock()
		return fmt.Errorf("%w: it has %d, the oldest kept is %d", ErrGone, after, oldest)
	}
	if err := j.dropThroughLocked(after); err != nil {
		j.mu.Unlock()
		return err
	}
	if j.answer != 0 && after >= j.answer {
		j.deliveredLocked() // the engine has the answer: nothing is left to send
	}
	// What the engine does not have goes out again, before what was kept.
	j.sent, j.cur = after, cursor{}
	j.live, j.replaying = s, true
	j.wakeLocked()
	j.mu.Unlock()
	for {
		j.mu.Lock()
		if j.closed || j.live != s {
			j.mu.Unlock()
			return ErrLost
		}
		if j.sent == j.next-1 {
			j.replaying = false
			j.wakeLocked()
			j.mu.Unlock()
			return nil
		}
		f, inMemory, err := j.nextLocked()
		if err != nil {
			j.detachLocked(s)
			j.mu.Unlock()
			return err
		}
		out := f.data
		if inMemory {
			out = bytes.Clone(f.data)
		}
		// Sent now, it is retained: older retained frames may make room.
		j.wakeLocked()
		j.mu.Unlock()
		if !s.Send(out) {
			j.mu.Lock()
			j.detachLocked(s)
			j.mu.Unlock()
			return ErrLost
		}
		j.mu.Lock()
		if !j.ack && j.answer != 0 && f.seq >= j.answer {
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
	j.dropAllLocked()
	j.live, j.replaying = s, false
	j.wakeLocked()
	return answered
}

// dropAllLocked drops every frame, retained or waiting, and removes the
// spill files.
func (j *Journal) dropAllLocked() {
	for len(j.segs) > 0 {
		j.removeFirstLocked()
	}
	for len(j.files) > 0 {
		j.closeFileLocked(j.files[0])
	}
	j.sent, j.cur = j.next-1, cursor{}
}

// Close drops everything kept and removes the spill files; Append does
// nothing from now on. The call is stopped, over, or its hold ended.
func (j *Journal) Close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	j.dropAllLocked()
	j.live = nil
	j.deliveredLocked()
	j.wakeLocked()
}

// SetAck says whether the engine of the live connection (the next one,
// while held) acknowledges answers: the answer is then delivered once Ack
// says the engine has it, not once it is sent.
func (j *Journal) SetAck(ack bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ack = ack
}

// Ack is the engine's acknowledgement of the call's answer: it reports
// false, and does nothing, unless the answer went to the live connection.
func (j *Journal) Ack() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.answer == 0 || j.sent < j.answer || j.live == nil || j.replaying {
		return false
	}
	j.deliveredLocked()
	return true
}

// Delivered is closed once the call's answer went to a live connection
// (and, when the engine acknowledges answers, was acknowledged), or the
// journal was closed.
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
	Disk       int64     // bytes of the spill files
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
		Memory:     j.memory,
		Disk:       j.disk,
		PeakMemory: j.peakMemory,
		PeakDisk:   j.peakDisk,
		Paused:     j.waiting,
	}
}
