package runner

// The contract between the worker and its runtime: how a runner is
// started beyond `PYTHON RUNTIME`, what it is handed on which descriptor,
// and what it says back outside the protocol's JSON lines. The runtime's
// half is the block "The worker's wire" at the top of
// agent/runtime/worker_main.py, with its modes described in that file's
// docstring; TestWireMatchesTheRuntime pins every value below to its twin
// there. A value changed on one side only fails that test.
//
// The three modes, each a flag right after the runtime's path:
//
//	RUNTIME --fluksio-output FD ...
//	    the node's stdout pipe at FD, its stderr pipe at FD+1 (the worker
//	    reads both, nodeout.go), and at FD+2 the read end of a pipe that
//	    holds the token of the runtime's output marks and then ends: the
//	    runtime reads it and closes it before any node code runs, so the
//	    token is never in argv or the environment.
//	RUNTIME --fluksio-spare FD [MOD,MOD]
//	    a spare (warm.go): it imports the modules and reports on FD, one
//	    JSON object, then waits for its request like any runner.
//	RUNTIME --fluksio-zygote REPORT CONTROL EXITS [MOD,MOD]
//	    a zygote (zygote.go): it reports on REPORT as a spare does, then
//	    forks a runner for each forkRequest on CONTROL (a unix seqpacket
//	    socket) and answers with the runner's pid in decimal ("0": it could
//	    not fork); it reports each runner's exit on EXITS, a pipe, in
//	    records of exitRecordSize bytes (zygote_exits.go).
//
// A runtime that is not the worker's own (one the engine serves, or
// --runtime FILE) is given spares only when its text names spareFlag
// (speaksSpareMode): one that does not would never report.

import (
	"bytes"
	"os"
)

// sandboxForksEnv, in a zygote's environment where calls are sandboxed,
// names the call directories' directory and then the owner's paths
// (--sandbox-bind), as a JSON list: each runner it forks hides the first
// but for its own directory, and shows the others again above its own
// /tmp (worker_main.py's SANDBOX_FORKS_ENV, sandbox_fork). Its
// report's "no_forks" says why forks cannot be sandboxed, where they
// cannot (spareReport.NoForks).
const sandboxForksEnv = "FLUKSIO_SANDBOX_FORKS"

// The flags of the runtime's modes (worker_main.py's SPARE_FLAG,
// ZYGOTE_FLAG, OUTPUT_FLAG).
const (
	spareFlag  = "--fluksio-spare"
	zygoteFlag = "--fluksio-zygote"
	outputFlag = "--fluksio-output"
)

// Descriptor positions. The runtime reads a mode's own from its argv;
// those it assumes have twins (worker_main.py's OUTPUT_TOKEN_AFTER,
// FORK_FDS, FORKED_OUTPUT_FD).
const (
	// spareReportFD is where a spare reports what it loaded.
	spareReportFD = 3
	// zygoteReportFD, zygoteControlFD and zygoteExitsFD are a zygote's
	// report pipe, control socket and exit-record pipe.
	zygoteReportFD  = 3
	zygoteControlFD = 4
	zygoteExitsFD   = 5
	// outputTokenAfter is how far past --fluksio-output's FD its token's
	// pipe is: after the stdout and stderr pipes.
	outputTokenAfter = 2
	// forkFDs is how many descriptors a fork request carries: the
	// runner's stdin, stdout and stderr, then the node's two output pipes,
	// which the forked runner has at forkedOutputFD and the next.
	forkFDs        = 5
	forkedOutputFD = 3
)

// forkRequest is what the zygote's fork gets besides the descriptors
// (worker_main.py's FORK_REQUEST_KEYS). The token travels here, on the
// worker's private socket to the zygote, which runs no node code.
type forkRequest struct {
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	Token string   `json:"token"`
}

// forkAnswerMax bounds the zygote's answer: a pid in decimal, or "0"
// (worker_main.py's FORK_FAILED) where it could not fork.
const forkAnswerMax = 32

// exitRecordSize is one exit report (worker_main.py's EXIT_RECORD_SIZE):
// the pid and the raw wait status, 32 bits each, and the peak resident
// memory in KiB, 64 bits, in the machine's byte order.
const exitRecordSize = 16

// The output mark (worker_main.py's MARK_PREFIX, MARK_SUFFIX and
// MARK_TOKEN_SIZE): markPrefix + token + markSuffix, the token
// markTokenSize hex digits of this runner's.
const (
	markPrefix    = "\x00fluksio:"
	markSuffix    = "\x00"
	markTokenSize = 32
)

// The log event budget and line rules (worker_main.py's LOG_BURST,
// LOG_RATE, LOG_TAIL and LOG_LINE_MAX; nodeout.go applies them to what
// the worker reads, the runtime's LogPump to what it reads itself).
const (
	logBurst    = 1000 // lines at once
	logRate     = 200  // lines a second after the burst
	logTail     = 100  // the last lines over the budget, always sent before the answer
	nodeLineMax = 8192 // bytes; a longer line is cut (one dumped array must not be MiB of log)
)

// speaksSpareMode reports whether the runtime at path knows spare mode: its
// text names spareFlag. The worker's own runtime does; a runtime that does
// not would take the flag for nothing, never report, and hold a spare's
// place until spareReadyTimeout.
func speaksSpareMode(path string) bool {
	text, err := os.ReadFile(path)
	return err == nil && bytes.Contains(text, []byte(spareFlag))
}
