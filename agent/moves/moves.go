// Package moves keeps a state to the legal moves of a table: the spare
// runners' (agent/runner) and the calls' (agent). A move its caller knows
// to be legal is loud when it is not, since that is a bug in the code that
// moves it (containerd's shim panics on an impossible transition); a move
// that may lose a race says whether it was made.
package moves

import (
	"fmt"
	"log/slog"
	"slices"
)

// Table is every legal move: from a state, the states it may go to. A
// state missing from it is final.
type Table[S comparable] map[S][]S

// PanicOnIllegal makes an illegal Must panic instead of logging it; the
// tests of the packages that keep states set it.
var PanicOnIllegal = false

// Try moves *state to to, where that is a legal move from *state, and
// reports whether it did: for a move that may lose to another, whose false
// its caller expects and handles.
func (t Table[S]) Try(state *S, to S) bool {
	if !slices.Contains(t[*state], to) {
		return false
	}
	*state = to
	return true
}

// Must moves *state to to, a move its caller knows is legal. An illegal
// one changes nothing and is said as "WHAT cannot move from A to B (a bug
// in WHERE; please report it)": a panic under PanicOnIllegal, an error in
// log (slog's default for nil) otherwise, where the worker goes on.
func (t Table[S]) Must(state *S, to S, what, where string, log *slog.Logger) {
	if t.Try(state, to) {
		return
	}
	msg := fmt.Sprintf("%s cannot move from %v to %v (a bug in %s; please report it)", what, *state, to, where)
	if PanicOnIllegal {
		panic(msg)
	}
	if log == nil {
		log = slog.Default()
	}
	log.Error(msg)
}
