// Package agent is the worker itself: the configuration, the session with
// the engine (protocol 2 over one WebSocket), each call as the engine sees
// it (its queue place, heartbeats and answer; its runner process is
// agent/runner's), and the graceful reload that re-executes the worker in
// place (reload.go).
package agent
