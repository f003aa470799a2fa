package runner

import (
	"fmt"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/moves"
	"github.com/fluksio/fluksio-worker/agent/moves/movestest"
)

// An illegal move of a spare is a bug: in this package's tests it panics.
func init() { moves.PanicOnIllegal = true }

var allSpareStates = []spareState{spareStarting, spareReady, spareClaimed, spareServing, spareRefused, spareRetired}

// Every move between two of a spare's states, legal or not, without a
// process: the legal ones are the diagram's (spareState), each made
// once; every other one is refused by tryMove and changes nothing.
func TestSpareStateMoves(t *testing.T) {
	legal := map[[2]spareState]bool{
		{spareStarting, spareReady}:   true, // it reported ready, or was forked
		{spareStarting, spareRetired}: true, // it could not start, died, or is not wanted
		{spareReady, spareClaimed}:    true, // a call took it out of the pool
		{spareReady, spareRetired}:    true, // stale, too old, dead, not wanted, the pool closed
		{spareClaimed, spareServing}:  true, // fresh: it serves the call
		{spareClaimed, spareRefused}:  true, // stale or dead: discarded, the call starts cold
	}
	movestest.Check(t, spareMoves, allSpareStates, legal)
}

// Every state's names are distinct and said.
func TestSpareStateString(t *testing.T) {
	seen := map[string]bool{}
	for _, st := range allSpareStates {
		name := st.String()
		if name == "unknown" || seen[name] {
			t.Errorf("state %d is named %q", st, name)
		}
		seen[name] = true
	}
}

// retireLocked takes out of the pool only a spare that is in it
// (starting or ready): one a call claimed or serves stays the call's,
// one retired or refused is out already. A zygote retired leaves its
// environment without one.
func TestRetireOnlyWhatIsInThePool(t *testing.T) {
	for _, st := range allSpareStates {
		for _, isZygote := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s zygote=%v", st, isZygote), func(t *testing.T) {
				p := &warmPool{}
				we := &warmEnv{}
				s := &spare{pool: p, we: we, state: st}
				if isZygote {
					we.zyg = &zygote{spare: s}
				} else if st.inPool() {
					we.spares = []*spare{s}
				}
				retired := p.retireLocked(s)
				if retired != st.inPool() {
					t.Fatalf("retireLocked of a %s spare: %v", st, retired)
				}
				if want := map[bool]spareState{true: spareRetired, false: st}[retired]; s.state != want {
					t.Fatalf("a %s spare is %s after retireLocked", st, s.state)
				}
				if we.zyg != nil || len(we.spares) != 0 {
					t.Fatalf("a %s spare retired is still in its environment", st)
				}
				if p.retireLocked(s) {
					t.Fatal("a spare was retired twice")
				}
			})
		}
	}
}

// inPool says whether a spare in this state is in its environment's
// place in the pool: starting or ready.
func (st spareState) inPool() bool { return st == spareStarting || st == spareReady }
