package runner

import "fmt"

// WarmShown says what --warm keeps, for the starting log line and
// `status`: where spares are forked from a zygote (a cgroup per call, the
// embedded runtime) an environment keeps forkedSparesAhead more than
// --warm, and its zygote is one process more, which a person counting
// processes would not expect from --warm 1. Call it after
// SetupContainment.
func WarmShown(spares int) string {
	if spares == 0 {
		return "off (--warm 0): every call starts its runner cold"
	}
	kept := fmt.Sprintf("%d spare runner%s started ahead (--warm %d)", spares, plural(spares), spares)
	if !forksHere() {
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
