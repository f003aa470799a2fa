// Package movestest checks a moves.Table against the moves a test says
// are legal, the same way for every state kept by one.
package movestest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/moves"
)

// Check tries every move between two of all, without the value that
// keeps the state: the legal ones (legal's) are made by Try and Must; every
// other one is refused by Try, panics under moves.PanicOnIllegal with both
// states named (Must), and changes nothing.
func Check[S interface {
	comparable
	fmt.Stringer
}](t *testing.T, table moves.Table[S], all []S, legal map[[2]S]bool) {
	t.Helper()
	moves.PanicOnIllegal = true
	for _, from := range all {
		for _, to := range all {
			t.Run(fmt.Sprintf("%s to %s", from, to), func(t *testing.T) {
				state := from
				want := legal[[2]S{from, to}]
				if moved := table.Try(&state, to); moved != want {
					t.Fatalf("move from %s to %s: moved=%v, want %v", from, to, moved, want)
				}
				if want && state != to || !want && state != from {
					t.Fatalf("move from %s to %s left it %s", from, to, state)
				}
				state = from
				func() {
					defer func() {
						msg, _ := recover().(string)
						if want && msg != "" || !want && !strings.Contains(msg, "cannot move from "+from.String()+" to "+to.String()) {
							t.Errorf("Must from %s to %s (legal: %v) recovered %q", from, to, want, msg)
						}
					}()
					table.Must(&state, to, "a test's value", "the test", nil)
				}()
				if !want && state != from {
					t.Errorf("an illegal move from %s to %s left it %s", from, to, state)
				}
			})
		}
	}
}
