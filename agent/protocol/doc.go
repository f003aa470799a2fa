// Package protocol holds every message of protocol 2, the conversation
// between an engine and this worker, and of the line protocol between the
// worker and a runner, each declared once. The worker and the fake engine
// in agent/enginetest both speak it from here.
//
// # Engine and worker
//
// The worker dials the engine's attach URL (wss://host/api/v1/workers/attach)
// and keeps that one WebSocket open; every message either way is one JSON
// object in a text frame, of any size. The token travels as the query
// parameter ?token= and as a bearer header. Each side pings; a peer silent
// for 20 s after a ping is gone.
//
// The first message is the worker's [Hello]: its name, labels, the Python
// it runs nodes with, how many calls it takes at once, a digest of that
// Python's installed packages, and what the machine holds. The engine
// answers {"op": "welcome", "name": ...}; any other op is a refusal, and so
// is HTTP 401 or 403 on the upgrade ([RefusedError]): the worker does not
// try again. [ParseWelcome] reads the answer.
//
// After the welcome the engine sends [Message]s: "run" and "compile" start
// a call identified by its call_id, with an optional "env" object for the
// node's environment ([EnvText] turns its values into text as the Python
// agent did); "cancel" stops one. While a call runs, the worker forwards
// every line its runner writes, unchanged, sends a [Heartbeat] at least
// every [HeartbeatInterval], and ends the call with exactly one answer: the
// runner's, or an [ErrorAnswer] of its own ([TypeNodeCancelled] when the
// worker stopped the call, [TypeRemoteError] when it failed here).
//
// A lost connection is retried after 1 s, doubling to 30 s, with jitter;
// calls of a lost connection are stopped, since the engine reschedules
// them.
//
// # Worker and runner
//
// Each call runs in a runner process (the Python runtime embedded in this
// binary, or the engine's own). The worker writes the request, without its
// env, as one JSON line on the runner's stdin ([RequestLine]). Every line the
// runner writes on stdout is a JSON object: one whose "event" is truthy in
// Python's sense is progress, and the first one without is the answer
// ([Classify], [ReadOutcome]). Anything else on stdout is logged, never
// forwarded; stderr is the node's own log.
package protocol
