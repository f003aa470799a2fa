// Package agent is the worker's session with the engine and the commands
// that run it. It owns:
//
//   - the Agent and its loop (agent.go): reconnect with backoff, stop,
//     drain, go idle, and the hello it sends;
//   - one connection, from the dial to its end, and its attachment: what
//     its messages and calls are handled with (session.go);
//   - the worker's state in one value (mode.go): its mode, serving,
//     reloading, draining, stopping or killing, and which request wins when
//     they meet, with its connection (connecting, attached, refused,
//     ended); the one writer of the state the status file shows;
//   - what each message from the engine does (dispatch.go);
//   - the book of calls (book.go): admission, the --parallel slots, the
//     queue of calls waiting for one (queue.go), --max-calls and each
//     call's end, under one lock; it owns each call's one state
//     (callstate.go: waiting, vetting by its pre-call hook in its slot,
//     running, held, ended) and its table of legal moves;
//   - a call as the engine sees it (call.go): its heartbeats and its one
//     answer; its runner process is agent/runner's;
//   - the graceful reload that re-executes the worker in place (reload.go);
//   - calls held through an outage of an engine that accepted the resume
//     extension, and their replay (resume.go; their kept output is
//     agent/hold's);
//   - health, pulse and metrics wiring (monitor.go);
//   - the environment node processes get (environ.go, tls.go);
//   - the run, inventory and selftest commands (run.go, selftest.go).
//
// The options table is agent/config's, every wire message agent/protocol's,
// the socket agent/engine's, the frame pool and the memory release
// agent/frame's, the status file agent/status's and the runner
// script agent/runtime's.
package agent
