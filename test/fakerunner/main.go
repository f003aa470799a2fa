// Command fakerunner stands in for Python and the runtime in the tests of
// test/ and the benchmarks: agent/runner/runnertest as a program.
package main

import "github.com/fluksio/fluksio-worker/agent/runner/runnertest"

func main() { runnertest.Main() }
