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
// Before it starts a runtime file in a mode, the worker asks it once what
// it speaks (askCapabilities):
//
//	RUNTIME --fluksio-capabilities
//	    it writes one runtimeCapabilities on stdout and exits.
//
// A runtime that does not know the flag (an engine's, from before the
// modes) takes it for a call whose request never comes, and says nothing
// of the kind: it is given no spares (one would never report).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// sandboxForksEnv, in a zygote's environment where calls are sandboxed,
// names the call directories' directory and then the owner's paths
// (--sandbox-bind), as a JSON list: each runner it forks hides the first
// but for its own directory, and shows the others again above its own
// /tmp (worker_main.py's SANDBOX_FORKS_ENV, sandbox_fork). Its
// report's "no_forks" says why forks cannot be sandboxed, where they
// cannot (spareReport.NoForks).
const sandboxForksEnv = "FLUKSIO_SANDBOX_FORKS"

// pinForksEnv, in a zygote's environment, is "1" where the pages its
// forks write may be pinned in it (worker_main.py's PIN_FORKS_ENV,
// ForkPinning): each fork then copies them at once, charged to the
// zygote's cgroup, not its call's. So it is "0" where calls have a memory
// limit (--call-memory-max), which a zygote's cgroup holds too.
const pinForksEnv = "FLUKSIO_PIN_FORKS"

// pinForks is pinForksEnv's value for the zygotes started now.
func pinForks() string {
	if callCgroupsSet().MemoryLimited() {
		return "0"
	}
	return "1"
}

// The flags of the runtime's modes (worker_main.py's SPARE_FLAG,
// ZYGOTE_FLAG, OUTPUT_FLAG).
const (
	spareFlag  = "--fluksio-spare"
	zygoteFlag = "--fluksio-zygote"
	outputFlag = "--fluksio-output"
)

// capabilitiesFlag asks a runtime what it speaks (worker_main.py's
// CAPABILITIES_FLAG).
const capabilitiesFlag = "--fluksio-capabilities"

// runtimeCapabilities is a runtime's answer to capabilitiesFlag
// (worker_main.py's CAPABILITY_VERSION and CAPABILITY_MODES): its
// version, and the flags of the modes it speaks (MODES).
type runtimeCapabilities struct {
	Version string   `json:"version"`
	Modes   []string `json:"modes"`
}

// speaks reports whether the runtime speaks the mode of flag.
func (c runtimeCapabilities) speaks(flag string) bool { return slices.Contains(c.Modes, flag) }

// capabilitiesTimeout bounds the run that asks: an interpreter start and
// the runtime's imports, on a loaded machine with a cold page cache.
const capabilitiesTimeout = 30 * time.Second

// capabilitiesMax bounds what is read of the answer: one small object.
const capabilitiesMax = 64 << 10

// askCapabilities runs rt with capabilitiesFlag alone, as the worker's
// own user with the runners' base environment and no call's, and reads
// its answer. It is asked rather than read off the file (a runtime may be
// bytecode, and a flag named in its text is no promise to speak it), once
// per runtime file (warmPool.speaksSpareMode): one interpreter start, on
// the first call of that runtime only.
func askCapabilities(cfg *Config, rt Runtime) (runtimeCapabilities, error) {
	ctx, cancel := context.WithTimeout(context.Background(), capabilitiesTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cfg.Python, cfg.script(rt), capabilitiesFlag)
	cmd.Env = effectiveEnv(cfg.env(nil))
	cmd.WaitDelay = time.Second // a child it left holding stdout
	var out limitedBuffer
	cmd.Stdout = &out
	err := cmd.Run()
	line, _, _ := strings.Cut(out.String(), "\n")
	var c runtimeCapabilities
	if jerr := json.Unmarshal([]byte(line), &c); jerr != nil {
		return runtimeCapabilities{}, fmt.Errorf("it does not answer %s (it exited %s; its output is no answer: %w)", capabilitiesFlag, exitStatus(err), jerr)
	}
	return c, nil
}

// limitedBuffer keeps the first capabilitiesMax bytes written to it.
type limitedBuffer struct{ strings.Builder }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := capabilitiesMax - b.Len(); room > 0 {
		b.Builder.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Descriptor positions. The runtime reads a mode's own from its argv;
// those it assumes have twins (worker_main.py's OUTPUT_TOKEN_AFTER,
// FORK_FDS, FORKED_OUTPUT_FD).
const (
	// firstExtraFD is a runner's first descriptor past stdin, stdout and
	// stderr: exec.Cmd.ExtraFiles[0]'s (extraFiles).
	firstExtraFD = 3
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

// extraFiles lays files out as a runner's exec.Cmd.ExtraFiles, each at
// the descriptor it is keyed by: the runtime is told that descriptor, and
// finds its file there. The descriptors run from firstExtraFD, without a
// gap.
func extraFiles(at map[int]*os.File) []*os.File {
	extra := make([]*os.File, len(at))
	for fd, f := range at {
		extra[fd-firstExtraFD] = f
	}
	return extra
}

// forkRequest is what the zygote's fork gets besides the descriptors
// (worker_main.py's FORK_ENV, FORK_CWD and FORK_TOKEN, which are its
// FORK_REQUEST_KEYS, in this order, which the zygote checks with
// FORK_REQUEST_SHAPE: a request with other keys is refused). The token
// travels here, on the worker's private socket to the zygote, which runs
// no node code.
type forkRequest struct {
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	Token string   `json:"token"`
}

// spareReport is what a spare (or a zygote) reports once it loaded the
// runtime and the preloads (worker_main.py's SPARE_WATCH, SPARE_FAILED,
// SPARE_THREADS): every file and directory its code came from or would
// import from, with whether it existed then; the preloads that failed, and
// why.
type spareReport struct {
	Watch  [][2]any          `json:"watch"`
	Failed map[string]string `json:"failed"`
	// Threads, when the process has more than one after its
	// preloads: how many, and the preload that started the first
	// (SPARE_THREADS_COUNT, SPARE_THREADS_MODULE).
	Threads *struct {
		Count  int    `json:"count"`
		Module string `json:"module"`
	} `json:"threads"`
	// NoForks, from a zygote that sandboxes its forks: why it cannot
	// (worker_main.py's SPARE_NO_FORKS, sandbox_fork_tried).
	NoForks string `json:"no_forks"`
}

// paths is what the report says to watch.
func (r spareReport) paths() []reportedPath {
	paths := make([]reportedPath, 0, len(r.Watch))
	for _, w := range r.Watch {
		path, _ := w[0].(string)
		existed, _ := w[1].(bool)
		paths = append(paths, reportedPath{path, existed})
	}
	return paths
}

// The environment every runner gets beyond its call's (worker_main.py's
// CALL_DIR_ENV, CANCEL_GRACE_ENV, ARTIFACT_URL_ENV, ARTIFACT_TOKEN_ENV,
// ARTIFACT_CACHE_ENV, ARTIFACT_SHARED_ENV): its call directory and
// --cancel-grace in seconds (callDir.env), the artifact store's URL and
// token and the artifact cache (the agent's runnerBaseEnv), and in a
// sandbox the worker's cache shown read-only (Config.sandboxEnv).
const (
	callDirEnv        = "FLUKSIO_CALL_DIR"
	cancelGraceEnv    = "FLUKSIO_CANCEL_GRACE"
	ArtifactURLEnv    = "FLUKSIO_ARTIFACT_URL"
	ArtifactTokenEnv  = "FLUKSIO_ARTIFACT_TOKEN"
	ArtifactCacheEnv  = "FLUKSIO_ARTIFACT_CACHE"
	ArtifactSharedEnv = "FLUKSIO_ARTIFACT_SHARED"
)

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
