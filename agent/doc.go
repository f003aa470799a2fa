// Package agent is the worker itself: the configuration, the session with
// the engine (protocol 2 over one WebSocket), and the lifecycle of each call
// in its runner process, and the graceful reload that re-executes the
// worker in place (reload.go).
package agent
