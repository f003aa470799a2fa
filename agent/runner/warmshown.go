package runner

import "fmt"

// WarmShown says what --warm keeps in a few plain words, for the start's
// log line and `status`; WarmDetail says how.
func WarmShown(spares int) string {
	if spares == 0 {
		return "off: every call starts Python cold (--warm 0)"
	}
	return fmt.Sprintf("%d spare runner%s kept ready (--warm %d)", spares, plural(spares), spares)
}

// WarmDetail says how --warm keeps its spares, for --log-level debug and
// `status --json`: where spares are forked from a zygote (a cgroup per
// call, the embedded runtime) an environment keeps forkedSparesAhead more
// than --warm, and its zygote is one process more, which a person counting
// processes would not expect from --warm 1. sb is the worker's sandbox
// (nil: none). Call it after SetupContainment.
func WarmDetail(spares int, sb *Sandbox) string {
	if spares == 0 {
		return "off (--warm 0): every call starts its runner cold"
	}
	kept := fmt.Sprintf("%d spare runner%s started ahead (--warm %d)", spares, plural(spares), spares)
	if !forksHere(sb) {
		if sb != nil && forksHere(nil) {
			// What a person comparing two machines would ask.
			return kept + ", each in a sandbox of its own, none forked from a zygote: a forked runner's sandbox needs Landlock's scopes (Linux 6.12), which this system does not offer"
		}
		return kept
	}
	n := spares + forkedSparesAhead
	return fmt.Sprintf("%s, and %d more forked ahead for each environment by its zygote, so that a call back to back finds one while the last is replaced: with one environment, %d spare runner%s and a zygote (forked spares share its memory until they write)",
		kept, forkedSparesAhead, n, plural(n))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
