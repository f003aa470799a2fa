package moves

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

type light int

const (
	red light = iota
	green
	off
)

var lights = Table[light]{red: {green}, green: {red, off}}

// Outside tests an illegal move is an error in the log the caller gives,
// naming what moved, both states and where the bug is; the state stays.
// A legal one says nothing.
func TestIllegalMoveIsAnErrorOutsideTests(t *testing.T) {
	PanicOnIllegal = false
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	state := red
	lights.Must(&state, off, "a light", "the crossing", log)
	if got := buf.String(); state != red || !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "a light cannot move from 0 to 2 (a bug in the crossing; please report it)") {
		t.Errorf("state %v, log %q", state, got)
	}
	buf.Reset()
	lights.Must(&state, green, "a light", "the crossing", log)
	if state != green || buf.Len() != 0 {
		t.Errorf("a legal move: state %v, log %q", state, buf.String())
	}
	if lights.Try(&state, red); state != red {
		t.Errorf("Try of a legal move left %v", state)
	}
	if lights.Try(&state, off) || state != red {
		t.Errorf("Try of an illegal move moved to %v", state)
	}
}
