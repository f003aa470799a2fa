//go:build race

package test

// raceEnabled builds the worker under test with the race detector too, so
// `go test -race` checks the agent's goroutines, not only the test's.
const raceEnabled = true
